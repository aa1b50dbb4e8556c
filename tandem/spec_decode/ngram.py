"""N-gram drafting (vLLM's `method: "ngram"`, prompt lookup decoding): the request's last n
tokens, for n from `prompt_lookup_max` down to `prompt_lookup_min`, are looked up earlier in its
prompt and output; the first n that occurs proposes the tokens that followed it, up to k.

Which occurrence: the most recent one. vLLM takes the earliest; we take the latest because a
request that repeats itself (an agent loop, a list, a copied passage being continued) is best
predicted by what it did last, and because an index that keeps the latest position is one dict
store per n-gram. The proposal may run into the request's own last tokens (the text repeats with
a period shorter than k), which is what a repetition looks like.

Cost: an index per request, `{n-gram: position of the token after its latest occurrence}` for
each n, extended by the tokens appended since the last lookup (one slice and one dict store per
n per token), so a lookup is (max - min + 1) dict reads whatever the context's length; vLLM
scans the whole context each step instead.
"""

from __future__ import annotations

from typing import Sequence


class NgramIndex:
    """One sequence's n-grams for n in [n_min, n_max]: where each last occurred.

    Invariant: every n-gram ending before position `indexed - 1` (so followed by at least one
    token) is in `latest[n]`, keyed by its tokens, valued by the position after it. The n-gram
    ending at the last token (the lookup's own key) is not: it would only match itself."""

    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.latest: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(n_min, n_max + 1)}
        self.indexed = 0  # positions < indexed whose following n-grams were stored

    def update(self, tokens: Sequence[int]) -> None:
        """Index the n-grams followed by a token of `tokens` (the whole sequence so far; it only
        ever grows: accepted tokens are appended, drafts never enter it)."""
        end = len(tokens) - 1  # the last token starts nothing yet
        for after in range(max(self.indexed, self.n_min), end + 1):
            for n, table in self.latest.items():
                if n <= after:
                    table[tuple(tokens[after - n:after])] = after
        self.indexed = max(self.indexed, end + 1)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
        `tokens` of n_max .. n_min tokens; [] when none occurs (or k <= 0)."""
        self.update(tokens)
        size = len(tokens)
        if k <= 0:
            return []
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            after = self.latest[n].get(tuple(tokens[size - n:]))
            if after is not None:
                return list(tokens[after:after + k])
        return []
