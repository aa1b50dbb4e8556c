"""The TLI vocabulary mapping and the feedback of target tokens into the draft's context, on two
trained toy tokenizers: one byte-level BPE (`Ġ`), one SentencePiece-style (`▁`, byte fallback)."""

from __future__ import annotations

import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from tandem.spec_decode.draft_feedback import TargetToDraft
from tandem.spec_decode.token_bytes import TokenKind, detect_conventions, vocabulary_bytes
from tandem.spec_decode.vocab_mapping import build_vocab_mapping, get_vocab_mapping
from tiny_models import build_bytelevel_tokenizer, build_sentencepiece_tokenizer

TEXTS = ["The future of AI is", "Hello, my name is Tandem.\n\n  Indented\tline",
         "naïve café, 日本語 and 🙂 emoji", "def f(x):\n    return x * 2", "a  b   c\n"]


@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory):
    return build_bytelevel_tokenizer(tmp_path_factory.mktemp("bl"))


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    return build_sentencepiece_tokenizer(tmp_path_factory.mktemp("sp"))


@pytest.fixture(scope="module")
def mapping(byte_tok, sp_tok):
    """Target: the byte-level tokenizer; draft: the SentencePiece one."""
    return build_vocab_mapping(byte_tok, sp_tok, len(byte_tok), len(sp_tok))


def _word_level(words: list[str], **specials) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0], **specials)


def test_conventions_are_detected(byte_tok, sp_tok):
    bl, sp = detect_conventions(byte_tok), detect_conventions(sp_tok)
    assert bl.byte_level and bl.space_marker == "Ġ" and not bl.byte_fallback
    assert not sp.byte_level and sp.space_marker == "▁" and sp.byte_fallback
    wl = detect_conventions(_word_level(["<unk>", "a", "b"]))
    assert not wl.byte_level and wl.space_marker is None and not wl.byte_fallback


def test_space_markers_map_to_each_other(byte_tok, sp_tok, mapping):
    pairs = 0
    for s, d in sp_tok.get_vocab().items():
        if s.startswith("▁") and len(s) > 1 and ("Ġ" + s[1:]) in byte_tok.get_vocab():
            assert int(mapping.draft_to_target[d]) == byte_tok.get_vocab()["Ġ" + s[1:]], s
            pairs += 1
    assert pairs > 30  # "▁the" <-> "Ġthe", "▁of" <-> "Ġof", ...


def test_every_byte_has_a_twin(byte_tok, sp_tok, mapping):
    """<0x0A> and Ċ are the same byte, and so are all 256 (where the draft also has a text piece
    for a byte, such as "a" beside <0x61>, that piece is the twin: the tokenizer produces it)."""
    t_bytes, _, _ = vocabulary_bytes(byte_tok, len(byte_tok))
    _, d_kinds, _ = vocabulary_bytes(sp_tok, len(sp_tok))
    d_bytes, _, _ = vocabulary_bytes(sp_tok, len(sp_tok))
    single = {b[0]: i for i, b in enumerate(t_bytes) if b is not None and len(b) == 1}
    assert len(single) == 256
    for byte, target_id in single.items():
        d = int(mapping.target_to_draft[target_id])
        assert d >= 0 and d_bytes[d] == bytes([byte]), byte
    newline = int(mapping.target_to_draft[byte_tok.get_vocab()["Ċ"]])
    assert sp_tok.convert_ids_to_tokens(newline) == "<0x0A>" and d_kinds[newline] == TokenKind.BYTE


def test_map_is_one_to_one(mapping):
    d2t, t2d = mapping.draft_to_target, mapping.target_to_draft
    inside = d2t >= 0
    assert int(inside.sum()) == mapping.size == int((t2d >= 0).sum())
    assert len(set(d2t[inside].tolist())) == mapping.size
    assert (t2d[d2t[inside]] == inside.nonzero().flatten()).all()
    assert (mapping.draft_mask == inside).all()
    assert mapping.draft_ids.tolist() == sorted(mapping.draft_ids.tolist())


def test_specials_are_never_mapped_by_string(byte_tok, sp_tok, tmp_path):
    """Only the EOS pair (by role) crosses; a special that both spell alike stays unmapped."""
    draft = build_sentencepiece_tokenizer(tmp_path / "sp2")
    draft.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    m = build_vocab_mapping(byte_tok, draft, len(byte_tok), len(draft))
    for s in ("<pad>", "<bos>", "<unk>", "<|im_start|>"):
        assert int(m.draft_to_target[draft.convert_tokens_to_ids(s)]) == -1, s
    for s in ("<|endoftext|>", "<|im_start|>"):
        assert int(m.target_to_draft[byte_tok.convert_tokens_to_ids(s)]) == -1, s
    assert int(m.draft_to_target[draft.eos_token_id]) == byte_tok.eos_token_id


def test_added_tokens_map_by_their_literal_text(byte_tok, tmp_path):
    target = build_bytelevel_tokenizer(tmp_path / "bl2")
    draft = build_sentencepiece_tokenizer(tmp_path / "sp3")
    target.add_tokens(["<tool call>"])
    draft.add_tokens(["<tool call>"])
    m = build_vocab_mapping(target, draft, len(target), len(draft))
    assert int(m.draft_to_target[draft.convert_tokens_to_ids("<tool call>")]) == \
        target.convert_tokens_to_ids("<tool call>")


def test_padded_vocabularies_exclude_ids_without_strings(byte_tok, sp_tok):
    m = build_vocab_mapping(byte_tok, sp_tok, len(byte_tok) + 64, len(sp_tok) + 128)
    assert m.target_vocab_size == len(byte_tok) + 64 and m.draft_vocab_size == len(sp_tok) + 128
    assert (m.draft_to_target[len(sp_tok):] == -1).all()
    assert (m.target_to_draft[len(byte_tok):] == -1).all()
    # A model vocabulary smaller than its tokenizer: ids past it are never proposed or mapped.
    small = build_vocab_mapping(byte_tok, sp_tok, len(byte_tok), 300)
    assert small.draft_vocab_size == 300 and int(small.draft_ids.max()) < 300


def test_empty_intersection_is_a_clear_error():
    a = _word_level(["<unk>", "alpha", "beta"], eos_token="<unk>")
    b = _word_level(["[UNK]", "gamma", "delta"], eos_token="[UNK]")
    with pytest.raises(ValueError, match="no token in common"):
        build_vocab_mapping(a, b, 3, 3)


def test_small_intersection_warns(byte_tok, caplog):
    draft = _word_level(["<unk>", "a", "b", "zzz1", "zzz2", "zzz3", "zzz4", "zzz5"])
    with caplog.at_level(logging.WARNING, logger="tandem"):
        m = build_vocab_mapping(byte_tok, draft, len(byte_tok), len(draft))
    assert m.size == 2 and "expect a low acceptance rate" in caplog.text


def test_mapping_is_cached_per_pair(byte_tok, sp_tok):
    key = ("bl", None, "sp", None)
    first = get_vocab_mapping(byte_tok, sp_tok, len(byte_tok), len(sp_tok), key=key)
    assert get_vocab_mapping(byte_tok, sp_tok, len(byte_tok), len(sp_tok), key=key) is first


@pytest.mark.parametrize("direction", ["bytelevel->sp", "sp->bytelevel"])
def test_reencoding_feeds_the_draft_the_exact_text(byte_tok, sp_tok, direction):
    """Whatever the target emits, the draft's context decodes to the same text."""
    target, draft = (byte_tok, sp_tok) if direction == "bytelevel->sp" else (sp_tok, byte_tok)
    m = build_vocab_mapping(target, draft, len(target), len(draft))
    feedback = TargetToDraft(m, target, draft, "reencode")
    for text in TEXTS:
        ids = target.encode(text, add_special_tokens=False)
        assert draft.decode(feedback.prompt(ids)) == target.decode(ids) == text
        # One token at a time (as generation feeds them) gives the same sequence.
        assert sum((feedback.tokens([t]) for t in ids), []) == feedback.tokens(ids)


def test_tokens_without_twins_are_reencoded_not_unknown(byte_tok, sp_tok, mapping):
    feedback = TargetToDraft(mapping, byte_tok, sp_tok, "reencode")
    no_twin = [i for i in range(len(byte_tok)) if int(mapping.target_to_draft[i]) < 0
               and i not in byte_tok.all_special_ids]
    assert no_twin, "the toy pair should have target tokens without twins"
    for t in no_twin:
        ids = feedback.tokens([t])
        assert len(ids) >= 2 and sp_tok.unk_token_id not in ids
        assert sp_tok.decode(ids) == byte_tok.decode([t])


def test_unknown_token_mapping_keeps_one_position_per_token(byte_tok, sp_tok, mapping):
    feedback = TargetToDraft(mapping, byte_tok, sp_tok, "unk")
    for text in TEXTS:
        ids = byte_tok.encode(text, add_special_tokens=False)
        out = feedback.tokens(ids)
        assert len(out) == len(ids)
        for t, d in zip(ids, out):
            twin = int(mapping.target_to_draft[t])
            assert d == (twin if twin >= 0 else sp_tok.unk_token_id)


def test_partial_utf8_and_control_text_are_split_into_pieces(byte_tok, sp_tok):
    """Bytes that are no valid text, and text that the draft would encode to one of its control
    tokens, become the draft's own byte/text pieces of exactly those bytes."""
    m = build_vocab_mapping(sp_tok, byte_tok, len(sp_tok), len(byte_tok))
    feedback = TargetToDraft(m, sp_tok, byte_tok, "reencode")
    partial = "日".encode("utf-8")[:2]
    ids = feedback._reencode(partial)
    assert byte_tok.decode(ids + feedback._reencode("日".encode("utf-8")[2:])) == "日"
    control = feedback._reencode("<|im_end|>".encode("utf-8"))
    assert byte_tok.eos_token_id not in control and byte_tok.decode(control) == "<|im_end|>"


def test_target_bos_is_replaced_by_the_drafts_own(byte_tok, sp_tok, tmp_path):
    draft = build_sentencepiece_tokenizer(tmp_path / "sp_bos")
    draft._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", draft.bos_token_id)])
    target = build_bytelevel_tokenizer(tmp_path / "bl_bos")
    target._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", target.bos_token_id)])
    m = build_vocab_mapping(target, draft, len(target), len(draft))
    feedback = TargetToDraft(m, target, draft, "reencode")
    ids = target.encode("The future")
    assert ids[0] == target.bos_token_id
    out = feedback.prompt(ids)
    assert out[0] == draft.bos_token_id and draft.bos_token_id not in out[1:]
    assert draft.decode(out, skip_special_tokens=True) == "The future"
