"""Token strings to the bytes they stand for, whatever the tokenizer's conventions.

Byte-level BPE vocabularies (GPT-2, SmolLM2, Llama 3, Qwen) write every byte as one printable
character (`Ġ` is 0x20, `Ċ` is 0x0A, `Ã©` is "é"); SentencePiece-style ones (Gemma, Llama 2) write
a space as a marker (`▁`) and a byte without a piece of its own as `<0x0A>`. Compared as strings
such vocabularies share little; compared as the bytes each token stands for, they share most of
their text tokens, and all 256 single bytes. Nothing is assumed about a tokenizer: its space marker
and byte-level alphabet are detected by encoding probe strings.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Any, Optional

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Probe strings: a space before a letter shows the space marker; a newline, a space and a
# two-byte character show whether every byte is written as its own character (byte-level BPE).
_SPACE_PROBE = " a"
_BYTE_PROBE = "\n é"


class TokenKind(enum.IntEnum):
    """What a vocabulary entry is, in order of preference when two ids stand for the same bytes."""
    TEXT = 0         # an ordinary piece of text
    ADDED = 1        # a non-special added token: its content is literal text
    BYTE = 2         # a byte-fallback token such as <0x0A>
    SPECIAL = 3      # control tokens (<bos>, <|im_end|>, <unused0>): never mapped by string
    NONE = 4         # no string: an id past the tokenizer's length in a padded model vocabulary


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable character for each byte, inverted: character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class TokenizerConventions:
    byte_level: bool             # every byte is one character of GPT-2's alphabet
    space_marker: Optional[str]  # the character that stands for a space (None: a literal space)
    byte_fallback: bool          # the vocabulary holds the 256 <0xNN> byte tokens


def _token_string(tokenizer: Any, text: str) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return "".join(tokenizer.convert_ids_to_tokens(ids))


def detect_conventions(tokenizer: Any, vocab: Optional[dict[str, int]] = None
                       ) -> TokenizerConventions:
    vocab = tokenizer.get_vocab() if vocab is None else vocab
    alphabet = {b: c for c, b in byte_level_alphabet().items()}
    as_byte_level = "".join(alphabet[b] for b in _BYTE_PROBE.encode("utf-8"))
    byte_level = _token_string(tokenizer, _BYTE_PROBE) == as_byte_level
    spaced = _token_string(tokenizer, _SPACE_PROBE)
    marker = None
    if spaced.endswith("a") and len(spaced) > 1 and spaced[-2] != " ":
        marker = spaced[-2]
    byte_fallback = all(f"<0x{b:02X}>" in vocab for b in range(256))
    return TokenizerConventions(byte_level, marker, byte_fallback)


def special_ids(tokenizer: Any) -> set[int]:
    ids = set(int(i) for i in tokenizer.all_special_ids)
    ids.update(int(i) for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    return ids


def vocabulary_bytes(tokenizer: Any, model_vocab_size: int
                     ) -> tuple[list[Optional[bytes]], list[TokenKind], TokenizerConventions]:
    """For every id below `model_vocab_size`: the bytes it stands for (None for specials and ids
    without a string) and its kind. Ids past the tokenizer's length (a padded vocabulary) and past
    the model's vocabulary (tokens the model cannot produce) are left out."""
    vocab = tokenizer.get_vocab()
    conv = detect_conventions(tokenizer, vocab)
    alphabet = byte_level_alphabet()
    specials = special_ids(tokenizer)
    added = {int(i): tok.content for i, tok in tokenizer.added_tokens_decoder.items()
             if not tok.special}
    strings: list[Optional[str]] = [None] * model_vocab_size
    for s, i in vocab.items():
        if 0 <= i < model_vocab_size:
            strings[i] = s
    out: list[Optional[bytes]] = [None] * model_vocab_size
    kinds = [TokenKind.NONE] * model_vocab_size
    for i, s in enumerate(strings):
        if s is None:
            continue
        m = _BYTE_TOKEN.fullmatch(s) if conv.byte_fallback else None
        if m is not None:  # checked first: some tokenizers declare their byte tokens special
            out[i], kinds[i] = bytes([int(m.group(1), 16)]), TokenKind.BYTE
        elif i in specials:
            kinds[i] = TokenKind.SPECIAL
        elif i in added:  # matched on the raw text, before any space marker is applied
            out[i], kinds[i] = added[i].encode("utf-8"), TokenKind.ADDED
        elif conv.byte_level:
            try:
                out[i], kinds[i] = bytes(alphabet[c] for c in s), TokenKind.TEXT
            except KeyError:  # a character outside the byte alphabet: no byte reading
                kinds[i] = TokenKind.SPECIAL
        else:
            text = s.replace(conv.space_marker, " ") if conv.space_marker else s
            out[i], kinds[i] = text.encode("utf-8"), TokenKind.TEXT
    return out, kinds, conv
