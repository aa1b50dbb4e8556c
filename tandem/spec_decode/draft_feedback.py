"""Feeding the target's tokens to a draft with another tokenizer (TLI).

Every token the target emits (prompt, accepted drafts, recovered and bonus tokens) must reach the
draft's context. A token with a twin in the draft's vocabulary becomes that twin. One without:
- "reencode" (the default): its text is encoded with the draft's tokenizer, possibly into several
  draft tokens, so the draft keeps seeing the real text. The result is checked to stand for exactly
  the token's bytes; where the tokenizer disagrees (a partial UTF-8 character, text that would
  encode to a control token) the bytes are split greedily into the draft's own byte pieces.
- "unk" (vLLM's choice): the draft's unknown token, one position per target token.
Structural specials are not text: the target's BOS and padding are dropped (the draft gets its own
BOS, if its tokenizer adds one, at the start of the prompt); other specials re-encode their literal
text, or become unk. Translations are per token, so they are computed once and cached.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from tandem.spec_decode.token_bytes import special_ids
from tandem.spec_decode.vocab_mapping import VocabMapping

logger = logging.getLogger("tandem")


class TargetToDraft:
    def __init__(self, mapping: VocabMapping, target_tokenizer: Any, draft_tokenizer: Any,
                 mode: str) -> None:
        self.mode = mode
        self.draft_tokenizer = draft_tokenizer
        self.target_tokenizer = target_tokenizer
        self._t2d = mapping.target_to_draft.tolist()
        self._target_bytes = mapping.target_bytes
        self._draft_bytes: dict[int, bytes] = {i: b for b, i in mapping.draft_bytes.items()}
        self._by_bytes = mapping.draft_bytes
        self._max_piece = max((len(b) for b in self._by_bytes), default=1)
        self._dropped = {i for i in (target_tokenizer.bos_token_id, target_tokenizer.pad_token_id)
                         if i is not None} - set(mapping.target_ids.tolist())
        self._target_specials = special_ids(target_tokenizer)
        self.prefix = self._special_prefix(draft_tokenizer)
        self.unk = self._unknown_id(draft_tokenizer) if mode == "unk" else None
        self._cache: dict[int, tuple[int, ...]] = {}

    @staticmethod
    def _special_prefix(tokenizer: Any) -> list[int]:
        """The ids the draft's tokenizer puts before any text (its BOS, or nothing)."""
        plain = tokenizer.encode("a", add_special_tokens=False)
        full = tokenizer.encode("a")
        for start in range(len(full) - len(plain) + 1):
            if full[start:start + len(plain)] == plain:
                return list(full[:start])
        return []

    @staticmethod
    def _unknown_id(tokenizer: Any) -> int:
        if tokenizer.unk_token_id is not None:
            return int(tokenizer.unk_token_id)
        if tokenizer.eos_token_id is not None:
            logger.warning("heterogeneous_vocab_feedback='unk': the draft's tokenizer has no "
                           "unknown token; target tokens without a twin become its EOS instead.")
            return int(tokenizer.eos_token_id)
        raise ValueError("heterogeneous_vocab_feedback='unk' needs an unknown or EOS token in the "
                         "draft's tokenizer, and it has neither; use 'reencode'.")

    def prompt(self, target_ids: list[int]) -> list[int]:
        return self.prefix + self.tokens(target_ids)

    def tokens(self, target_ids: list[int]) -> list[int]:
        out: list[int] = []
        for t in target_ids:
            ids = self._cache.get(t)
            if ids is None:
                ids = self._cache[t] = self._translate(t)
            out.extend(ids)
        return out

    def _translate(self, t: int) -> tuple[int, ...]:
        twin = self._t2d[t] if 0 <= t < len(self._t2d) else -1
        if twin >= 0:
            return (twin,)
        if t in self._dropped:
            return ()
        if self.mode == "unk":
            return (self.unk,)
        b = self._target_bytes[t] if t < len(self._target_bytes) else None
        if b is None:  # a special: its literal text
            b = (self.target_tokenizer.convert_ids_to_tokens(t) or "").encode("utf-8")
        return self._reencode(b)

    def _reencode(self, b: bytes) -> tuple[int, ...]:
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text:
            ids = self.draft_tokenizer.encode(text, add_special_tokens=False)
            if b"".join(self._draft_bytes.get(i, b"\0?") for i in ids) == b:
                return tuple(int(i) for i in ids)
        return self._split(b)

    def _split(self, b: bytes) -> tuple[int, ...]:
        """Greedy longest pieces of the draft's vocabulary; a byte it cannot write is dropped
        (the draft then misses it, which costs acceptance, never correctness)."""
        out: list[int] = []
        i = 0
        while i < len(b):
            for j in range(min(len(b), i + self._max_piece), i, -1):
                piece: Optional[int] = self._by_bytes.get(b[i:j])
                if piece is not None:
                    out.append(piece)
                    i = j
                    break
            else:
                i += 1
        return tuple(out)
