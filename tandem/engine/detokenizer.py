"""Incremental detokenization and stop-string matching for one sequence.

Decoding a window that starts a few tokens back (prefix_offset) keeps word-boundary spaces right for
SentencePiece vocabularies; text ending in an incomplete UTF-8 sequence ("\ufffd") waits for more
tokens. Text that could still become a stop string is held back from streaming.
"""

from __future__ import annotations

from typing import Any, Optional

_INITIAL_CONTEXT = 5  # prompt tokens decoded as left context for the first output tokens


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], stop: list[str],
                 include_stop: bool, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_token_ids[-_INITIAL_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special = skip_special_tokens
        self.text = ""
        self.hold = max((len(s) for s in stop), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add_token(self, token_id: int, stops_allowed: bool = True) -> Optional[str]:
        """Append one token; return the stop string if the text now contains one (the text is then
        truncated at it). Below min_tokens (`stops_allowed` False) stop strings are not looked
        for, so the text stays whole."""
        self.tokens.append(token_id)
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        start = max(0, len(self.text) - self.hold)
        self.text += delta
        return self._check_stop(start) if stops_allowed else None

    def _check_stop(self, search_from: int) -> Optional[str]:
        best: Optional[tuple[int, str]] = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[:i + len(s)] if self.include_stop else self.text[:i]
        return s

    def visible_text(self, finished: bool) -> str:
        """Text safe to show: while running, hold back a tail that may start a stop string."""
        if finished or not self.stop or self.hold == 0:
            return self.text
        return self.text[:max(0, len(self.text) - self.hold)]
