"""Suffix decoding's data structure (Oliaro et al., arXiv 2411.04975; vLLM's `method: "suffix"`):
a suffix trie with counts, cut to `max_depth` tokens, over the text a request has seen, and the
drafts it proposes by following the most frequent continuation of the request's last tokens.

Flat, because one trie holds up to len(text) * max_depth nodes (96k for a 4,000-token prompt at
depth 24) and a Python object with a dict per node costs several hundred bytes. A node is an
index into six lists (count, token, best child, first child, next sibling, stamp); the edges are
one dict per tree from `parent * _STRIDE + token` (token ids in [0, 2**32)) to the child.
tracemalloc, 4,000 random tokens of a 1,000-token vocabulary at depth 24 (92,690 nodes): 179
bytes per node, 117 of them the dict (entry, key int, child-id int). array('i') fields measured
154 bytes but extend() 1.4x and speculate() 1.2x slower (array reads box; list reads do not).

Each node caches its most frequent child, so a draft never scans children. extend() keeps it in
O(1): a child that passes the best's count takes over, so among equal counts the child that
reached the count first wins (no dependence on hash order). remove() only lowers counts; a
parent whose best child lost a count, or which lost a child, is recomputed once at the end
from its sibling list: highest count, then earliest last increment (the stamp). Removing the
oldest sequence, as the global cache does, so leaves exactly the trie that the remaining
sequences would build afresh; removing another may break an exact tie differently.

Times on an Intel Xeon ("Intel(R) Xeon(R) Processor", 2 vCPUs under KVM, shared with other
jobs: best of repeated runs), CPython 3.11, depth 24, a 4,000-token prompt: extend() 8-10 us per
token of new text (6 for text seen before; the same one token per call). speculate() with
max_tokens 24: 19 us for the request's own tail (every length matches; the nodes come from the
frontier), 49 us for a pattern matching at all 24 lengths elsewhere (24 walks from the root,
most of the time), under 1 us when the last token never occurred. remove() 9 us per token.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

# Edge keys pack (parent, token) into one int: cheaper than a tuple key (no tuple object), and
# unique while token ids are below the stride.
_STRIDE = 1 << 32
_ROOT = 0


class _Seq:
    """One sequence's tokens (remove() walks them again) and its frontier: the nodes of the
    suffixes ending at its last token, frontier[d] at depth d, depths 0 .. max_depth."""

    __slots__ = ("tokens", "frontier")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.frontier: list[int] = [_ROOT]


class SuffixTree:
    """A depth-limited suffix trie with counts over one or more token sequences."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._child: dict[int, int] = {}
        # Node 0 is the root; its count stays 0 (no draft starts from an empty match).
        self._count = [0]
        self._token = [0]
        self._best = [-1]                 # the most frequent child, -1 for none
        self._first = [-1]                # children as a singly linked list, for remove()
        self._next = [-1]
        self._stamp = [0]                 # when the count last rose: remove()'s tie-break
        self._clock = 0
        self._used = 1                    # slots handed out, the root's included
        self._free: list[int] = []        # ids of deleted nodes, reused first
        self._seqs: dict[int, _Seq] = {}
        self._last: _Seq | None = None    # the sequence extended last

    @property
    def num_nodes(self) -> int:
        """Nodes in the trie, the root not counted."""
        return self._used - 1 - len(self._free)

    def _grow(self) -> None:
        """Room for an eighth more nodes (at least 64): in blocks, since six appends per node
        took a quarter of extend()'s time on new text; an eighth, about what appends leave
        spare, since a large fixed block would cost a short request more than its nodes."""
        more = max(64, len(self._count) >> 3)
        zeros, nones = [0] * more, [-1] * more
        self._count.extend(zeros)
        self._token.extend(zeros)
        self._best.extend(nones)
        self._first.extend(nones)
        self._next.extend(nones)
        self._stamp.extend(zeros)

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence seq_id (a new id starts a new sequence). Every suffix of the
        sequence, cut to max_depth tokens, is counted: after appending token t at position i,
        the paths tokens[j..i] for i - max_depth < j <= i each gain one count on their last node.
        Suffixes never cross from one sequence into another. O(max_depth) per token."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = _Seq()
        child, count, best, stamp = self._child, self._count, self._best, self._stamp
        token, first, nxt, free = self._token, self._first, self._next, self._free
        depth, clock, frontier, used = self.max_depth, self._clock, seq.frontier, self._used
        for t in tokens:
            if len(frontier) > depth:
                frontier.pop()         # depth max_depth: kept for speculate(), not extended
            # One stamp per token is enough: a parent is in the frontier once, so siblings
            # never rise in the same step.
            clock += 1
            new = [_ROOT]
            for n in frontier:
                key = n * _STRIDE + t
                c = child.get(key)
                if c is None:
                    if free:
                        c = free.pop()
                    else:
                        c = used
                        used += 1
                        if c == len(count):
                            self._grow()
                    token[c] = t
                    nxt[c] = first[n]
                    first[n] = c
                    child[key] = c
                cnt = count[c] + 1
                count[c] = cnt
                stamp[c] = clock
                b = best[n]
                if b < 0 or cnt > count[b]:
                    best[n] = c
                new.append(c)
            frontier = new
        self._clock, self._used = clock, used
        self._last = seq
        seq.frontier = frontier
        seq.tokens.extend(tokens)

    def remove(self, seq_id: int) -> None:
        """Take a whole sequence out again (its counts decremented, nodes at zero deleted).
        KeyError if seq_id is not in the tree."""
        seq = self._seqs.pop(seq_id)
        if seq is self._last:
            self._last = None
        child, count, best = self._child, self._count, self._best
        depth = self.max_depth
        dead: list[int] = []          # keys of edges whose child fell to zero, in order
        dirty: set[int] = set()       # parents whose best child or child list must be redone
        frontier = [_ROOT]
        for t in seq.tokens:
            new = [_ROOT]
            for n in frontier:
                key = n * _STRIDE + t
                c = child[key]
                cnt = count[c] - 1
                count[c] = cnt
                if cnt == 0:
                    dead.append(key)
                    dirty.add(n)
                elif best[n] == c:
                    dirty.add(n)
                new.append(c)
            if len(new) > depth:
                new.pop()
            frontier = new
        # Deleted nodes still link their siblings until every dirty list has been redone.
        for n in dirty:
            if n == _ROOT or count[n] > 0:
                self._redo_children(n)
        for key in dead:
            c = child.pop(key)
            best[c] = -1
            self._first[c] = -1
            self._free.append(c)

    def _redo_children(self, n: int) -> None:
        """Unlink n's children at zero and recompute its best child (highest count, then the
        earliest last increment: the child that reached the count first)."""
        count, stamp, nxt = self._count, self._stamp, self._next
        prev, c, b = -1, self._first[n], -1
        while c >= 0:
            following = nxt[c]
            if count[c] == 0:
                if prev < 0:
                    self._first[n] = following
                else:
                    nxt[prev] = following
            else:
                if b < 0 or count[c] > count[b] or count[c] == count[b] and stamp[c] < stamp[b]:
                    b = c
                prev = c
            c = following
        self._best[n] = b

    def speculate(self, pattern: Sequence[int], max_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> tuple[list[int], float]:
        """(draft tokens, score). For each match length m = 1 .. len(pattern) (pattern is the
        request's last tokens, at most max_depth of them) whose last m tokens are a path in the
        trie: from that node, follow the most frequent child repeatedly, for at most
        min(max_tokens, floor(m * max_spec_factor)) tokens; each step's probability is
        child.count / node.count, multiplied along the path; stop before a token whose
        cumulative probability falls below min_token_prob. The score of a draft is the sum of
        its tokens' cumulative probabilities (its expected number of accepted tokens). Return
        the draft with the highest score (ties: the longer match length), or ([], 0.0).
        A longer pattern is cut to its last max_depth tokens (no path is longer)."""
        get, count, best, token = self._child.get, self._count, self._best, self._token
        pat = list(pattern[-self.max_depth:]) if len(pattern) > self.max_depth else list(pattern)
        size = len(pat)
        last = self._last
        if size and last is not None and last.tokens[-size:] == pat:
            # The usual local-tree call: the pattern is the tail of the sequence extended last,
            # whose frontier already holds the node of every match (walking the matches from
            # the root took most of the time).
            nodes = last.frontier
        else:
            nodes = [_ROOT]
            for m in range(1, size + 1):
                # The last m tokens missing, so are the last m + 1: stop at the first miss.
                n: int | None = _ROOT
                for t in pat[size - m:]:
                    n = get(n * _STRIDE + t)
                    if n is None:
                        break
                if n is None:
                    break
                nodes.append(n)
        best_draft: list[int] = []
        best_score = 0.0
        for m in range(1, min(size + 1, len(nodes))):
            n = nodes[m]
            limit = min(max_tokens, math.floor(m * max_spec_factor))
            draft: list[int] = []
            score, prob = 0.0, 1.0
            while len(draft) < limit:
                c = best[n]
                if c < 0:
                    break
                prob *= count[c] / count[n]
                if prob < min_token_prob:
                    break
                draft.append(token[c])
                score += prob
                n = c
            if draft and score >= best_score:
                best_draft, best_score = draft, score
        return best_draft, best_score


class SuffixCache:
    """What the suffix proposer keeps across requests: one SuffixTree per active request over its
    prompt and output so far ('local'), and one global SuffixTree over the outputs of the last
    max_cached_requests finished requests (evicting the oldest, first in first out)."""

    def __init__(self, max_depth: int, max_cached_requests: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if max_cached_requests < 0:
            raise ValueError(f"max_cached_requests must be >= 0, got {max_cached_requests}")
        self.max_depth = max_depth
        self.max_cached_requests = max_cached_requests
        self._local: dict[str, SuffixTree] = {}
        self._outputs: dict[str, list[int]] = {}
        self._global = SuffixTree(max_depth)
        self._cached: deque[int] = deque()   # global sequence ids, oldest first
        self._next_seq = 0

    def start(self, req_id: str, prompt: Sequence[int]) -> None:
        """The local tree from the prompt (a request started again begins afresh)."""
        tree = SuffixTree(self.max_depth)
        tree.extend(0, prompt)
        self._local[req_id] = tree
        self._outputs[req_id] = []

    def append(self, req_id: str, tokens: Sequence[int]) -> None:
        """New output tokens of an active request (KeyError if it is not active)."""
        self._local[req_id].extend(0, tokens)
        self._outputs[req_id].extend(tokens)

    def finish(self, req_id: str) -> None:
        """Drop the local tree; the request's output (not its prompt, which the next request's
        own local tree holds if it repeats) enters the global tree. No-op if unknown."""
        if self._local.pop(req_id, None) is None:
            return
        output = self._outputs.pop(req_id)
        if self.max_cached_requests == 0:
            return
        seq = self._next_seq
        self._next_seq += 1
        self._global.extend(seq, output)
        self._cached.append(seq)
        while len(self._cached) > self.max_cached_requests:
            self._global.remove(self._cached.popleft())

    def drop(self, req_id: str) -> None:
        """Forget an active request without caching its output (no-op if unknown)."""
        self._local.pop(req_id, None)
        self._outputs.pop(req_id, None)

    def clear_global(self) -> None:
        """Empty the cross-request tree (benchmarks that rerun the same prompts)."""
        self._global = SuffixTree(self.max_depth)
        self._cached.clear()

    def active(self, req_id: str) -> bool:
        return req_id in self._local

    def num_output(self, req_id: str) -> int:
        """Output tokens an active request's tree holds (KeyError if it is not active)."""
        return len(self._outputs[req_id])

    def speculate(self, req_id: str, pattern: Sequence[int], max_tokens: int,
                  max_spec_factor: float, min_token_prob: float) -> list[int]:
        """The better-scoring draft of the local tree and the global tree (ties: local); a
        request that is not active drafts from the global tree alone."""
        args = (pattern, max_tokens, max_spec_factor, min_token_prob)
        local = self._local.get(req_id)
        draft, score = local.speculate(*args) if local is not None else ([], 0.0)
        other, other_score = self._global.speculate(*args)
        return other if other_score > score else draft
