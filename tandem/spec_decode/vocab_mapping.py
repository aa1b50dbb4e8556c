"""Token-Level Intersection (TLI) vocabulary mapping between a target and a draft tokenizer.

Two tokens are twins when they stand for the same bytes (see token_bytes.py). The intersection is
the set of twins; it is one-to-one: where several ids of one side stand for the same bytes (Gemma
has both "\\n" and <0x0A>), the one the tokenizer itself produces for those bytes is kept. Special
tokens are never mapped by their strings (`<unk>` or `</s>` may mean different things in two
families); the end-of-sequence tokens are paired by role instead, so the draft can propose the end.

The draft proposes only inside the intersection and its ids map to target ids; the target is never
restricted. Mappings are cached per tokenizer pair, so a second engine on the same pair starts fast.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from tandem.spec_decode.token_bytes import TokenKind, TokenizerConventions, vocabulary_bytes

logger = logging.getLogger("tandem")

SMALL_INTERSECTION = 0.5  # warn when the twins cover less than this share of the draft vocabulary


@dataclass
class VocabMapping:
    draft_to_target: torch.Tensor  # [V_draft] int64, -1 outside the intersection
    target_to_draft: torch.Tensor  # [V_target] int64, -1 where a target token has no twin
    draft_mask: torch.Tensor       # [V_draft] bool, True where the draft may propose
    draft_ids: torch.Tensor        # [I] int64, intersection in ascending draft-id order
    target_ids: torch.Tensor       # [I] int64, their twins (same order)
    target_bytes: list[Optional[bytes]]  # [V_target] what each target token stands for
    draft_bytes: dict[bytes, int]        # bytes -> the draft's canonical id for them
    target_conventions: TokenizerConventions
    draft_conventions: TokenizerConventions

    @property
    def size(self) -> int:
        return int(self.draft_ids.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.target_to_draft.numel())

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_to_target.numel())

    def to(self, device: torch.device) -> VocabMapping:
        moved = {name: getattr(self, name).to(device) for name in
                 ("draft_to_target", "target_to_draft", "draft_mask", "draft_ids", "target_ids")}
        return VocabMapping(**moved, target_bytes=self.target_bytes, draft_bytes=self.draft_bytes,
                            target_conventions=self.target_conventions,
                            draft_conventions=self.draft_conventions)


def _describe(conv: TokenizerConventions) -> str:
    kind = "byte-level" if conv.byte_level else ("byte fallback" if conv.byte_fallback
                                                  else "no byte tokens")
    return f"{kind}, space marker {conv.space_marker!r}"


def _canonical_ids(tokenizer: Any, by_id: list[Optional[bytes]], kinds: list[TokenKind]
                   ) -> tuple[dict[bytes, int], int]:
    """bytes -> the one id kept for them, and how many ids were dropped as duplicates."""
    chosen: dict[bytes, int] = {}
    duplicates: dict[bytes, list[int]] = {}
    for i, b in enumerate(by_id):
        if b:
            if b in chosen:
                duplicates.setdefault(b, [chosen[b]]).append(i)
            else:
                chosen[b] = i
    dropped = 0
    for b, ids in duplicates.items():
        dropped += len(ids) - 1
        ids = sorted(ids, key=lambda i: (kinds[i], i))
        produced = _produced_id(tokenizer, b)
        chosen[b] = produced if produced in ids else ids[0]
    return chosen, dropped


def _produced_id(tokenizer: Any, b: bytes) -> Optional[int]:
    """The single id the tokenizer encodes these bytes to, if it does."""
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return None
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


def build_vocab_mapping(target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int,
                        draft_vocab_size: int) -> VocabMapping:
    """The TLI mapping of two tokenizers over their models' vocabularies (padding excluded).
    Raises ValueError when the two share no token."""
    t_bytes, t_kinds, t_conv = vocabulary_bytes(target_tokenizer, target_vocab_size)
    d_bytes, d_kinds, d_conv = vocabulary_bytes(draft_tokenizer, draft_vocab_size)
    t_canon, t_dropped = _canonical_ids(target_tokenizer, t_bytes, t_kinds)
    d_canon, d_dropped = _canonical_ids(draft_tokenizer, d_bytes, d_kinds)
    pairs = sorted((d, t_canon[b]) for b, d in d_canon.items() if b in t_canon)
    if not pairs:
        raise ValueError(
            "use_heterogeneous_vocab: the draft's and the target's vocabularies have no token in "
            f"common (target: {sum(b is not None for b in t_bytes)} text tokens, space marker "
            f"{t_conv.space_marker!r}; draft: {sum(b is not None for b in d_bytes)}, space "
            f"marker {d_conv.space_marker!r}), so the draft could never propose anything. Use a "
            "draft whose tokenizer shares tokens with the target's.")
    t_eos, d_eos = target_tokenizer.eos_token_id, draft_tokenizer.eos_token_id
    if (t_eos is not None and d_eos is not None and t_eos < target_vocab_size
            and d_eos < draft_vocab_size):
        pairs = sorted([(d, t) for d, t in pairs if d != d_eos and t != t_eos]
                       + [(int(d_eos), int(t_eos))])
    draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.int64)
    target_ids = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    d2t = torch.full((draft_vocab_size,), -1, dtype=torch.int64)
    d2t[draft_ids] = target_ids
    t2d = torch.full((target_vocab_size,), -1, dtype=torch.int64)
    t2d[target_ids] = draft_ids
    mapping = VocabMapping(d2t, t2d, d2t >= 0, draft_ids, target_ids, t_bytes, d_canon,
                           t_conv, d_conv)
    n = mapping.size
    d_len = sum(k is not TokenKind.NONE for k in d_kinds)  # padding ids are no vocabulary
    t_len = sum(k is not TokenKind.NONE for k in t_kinds)
    logger.info("Vocabulary intersection (TLI): %d tokens, %.1f%% of the draft's %d and %.1f%% of "
                "the target's %d (draft %s, target %s; %d and %d duplicate ids folded)",
                n, 100 * n / d_len, d_len, 100 * n / t_len, t_len, _describe(d_conv),
                _describe(t_conv), d_dropped, t_dropped)
    if n / d_len < SMALL_INTERSECTION:
        logger.warning("The draft can propose only %.1f%% of its vocabulary (%d tokens in common "
                       "with the target, below %.0f%%): expect a low acceptance rate.",
                       100 * n / d_len, n, 100 * SMALL_INTERSECTION)
    return mapping


_CACHE: dict[tuple, VocabMapping] = {}


def get_vocab_mapping(target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int,
                      draft_vocab_size: int, key: Optional[tuple] = None) -> VocabMapping:
    """build_vocab_mapping, cached per tokenizer pair. `key` names the pair (tokenizer paths and
    revisions); without one nothing is cached."""
    if key is None:
        return build_vocab_mapping(target_tokenizer, draft_tokenizer, target_vocab_size,
                                   draft_vocab_size)
    key = key + (target_vocab_size, draft_vocab_size)
    if key not in _CACHE:
        _CACHE[key] = build_vocab_mapping(target_tokenizer, draft_tokenizer, target_vocab_size,
                                          draft_vocab_size)
    return _CACHE[key]
