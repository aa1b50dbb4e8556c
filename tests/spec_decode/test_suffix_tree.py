"""The suffix trie and cache behind suffix decoding: hand-made sequences with known drafts, remove()
against a trie built afresh, the cache's local/global choice and FIFO eviction, and a randomized
comparison with a brute-force count of every substring."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest

from tandem.spec_decode.suffix_tree import SuffixCache, SuffixTree


def tree_of(*seqs: list[int], depth: int = 8) -> SuffixTree:
    tree = SuffixTree(depth)
    for i, seq in enumerate(seqs):
        tree.extend(i, seq)
    return tree


def dump(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    """Every path of the trie with its count, read from the child lists (white box: it also
    checks that remove() unlinked every node it deleted and that the edge dict agrees)."""
    out: dict[tuple[int, ...], int] = {}
    stack: list[tuple[int, tuple[int, ...]]] = [(0, ())]
    while stack:
        node, path = stack.pop()
        c = tree._first[node]
        while c >= 0:
            p = path + (tree._token[c],)
            assert tree._count[c] > 0, p
            out[p] = tree._count[c]
            stack.append((c, p))
            c = tree._next[c]
    assert len(out) == len(tree._child) == tree.num_nodes
    return out


# --- the brute-force reference -------------------------------------------------------------


class Reference:
    """Counts of every substring of length <= depth (within one sequence) and the time of each
    one's last increment; the best child is the highest count, then the one that got there
    first."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.counts: dict[tuple[int, ...], int] = {}
        self.stamps: dict[tuple[int, ...], int] = {}
        self.history: dict[int, list[int]] = {}
        self.clock = 0

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        seen = self.history.setdefault(seq_id, [])
        for t in tokens:
            seen.append(t)
            self.clock += 1
            for j in range(max(0, len(seen) - self.depth), len(seen)):
                path = tuple(seen[j:])
                self.counts[path] = self.counts.get(path, 0) + 1
                self.stamps[path] = self.clock

    def speculate(self, pattern: list[int], max_tokens: int, factor: float,
                  min_prob: float) -> tuple[list[int], float]:
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
        for path in self.counts:
            children[path[:-1]].append(path)
        pat = list(pattern)[-self.depth:] if pattern else []
        best: list[int] = []
        best_score = 0.0
        for m in range(1, len(pat) + 1):
            node = tuple(pat[-m:])
            if node not in self.counts:
                break
            limit = min(max_tokens, math.floor(m * factor))
            draft: list[int] = []
            score, prob = 0.0, 1.0
            while len(draft) < limit and children[node]:
                nxt = max(children[node], key=lambda c: (self.counts[c], -self.stamps[c]))
                prob *= self.counts[nxt] / self.counts[node]
                if prob < min_prob:
                    break
                draft.append(nxt[-1])
                score += prob
                node = nxt
            if draft and score >= best_score:
                best, best_score = draft, score
        return best, best_score


# --- hand-made sequences ---------------------------------------------------------------------


def test_most_frequent_continuation():
    tree = tree_of([5, 1, 7, 5, 1, 7, 5, 1, 8, 5])
    # (5) occurs 4 times (once at the very end), followed by 1 three times.
    assert tree.speculate([5], 1, 1.0, 0.0) == ([1], 0.75)
    # (5, 1): 7 twice, 8 once.
    assert tree.speculate([5], 2, 2.0, 0.0) == ([1, 7], 0.75 + 0.75 * 2 / 3)


def test_tie_goes_to_the_child_that_reached_the_count_first():
    # After 1: 3 reaches count 1 first, 2 reaches count 2 first, then 3 reaches 2.
    tree = tree_of([1, 3, 1, 2, 1, 2, 1, 3, 1])
    assert tree.speculate([1], 1, 1.0, 0.0) == ([2], 2 / 5)
    assert tree_of([1, 2, 1, 3, 1]).speculate([1], 1, 1.0, 0.0) == ([2], 1 / 3)
    assert tree_of([1, 3, 1, 2, 1]).speculate([1], 1, 1.0, 0.0) == ([3], 1 / 3)


def test_min_token_prob_prunes():
    tree = tree_of([1, 2, 5, 1, 3, 5, 1])     # after 1: 2 once, 3 once, the end once
    assert tree.speculate([1], 1, 1.0, 0.5) == ([], 0.0)
    assert tree.speculate([1], 1, 1.0, 0.3) == ([2], 1 / 3)
    # Later steps are certain, so the cumulative probability stays at 1/3.
    assert tree.speculate([1], 3, 3.0, 0.3) == ([2, 5, 1], 1.0)
    assert tree.speculate([1], 3, 3.0, 0.34) == ([], 0.0)


def test_max_spec_factor_caps_by_match_length():
    tree = tree_of([1, 2, 3, 4, 5, 6, 7, 8, 9], depth=16)
    assert tree.speculate([1, 2], 10, 1.0, 0.0) == ([3, 4], 2.0)
    # factor 0.5: the match of 2 gives 1 token, the match of 1 none (floor(0.5) = 0).
    assert tree.speculate([1, 2], 10, 0.5, 0.0) == ([3], 1.0)
    assert tree.speculate([2], 10, 0.5, 0.0) == ([], 0.0)
    assert tree.speculate([1, 2], 10, 3.0, 0.0) == ([3, 4, 5, 6, 7, 8], 6.0)
    assert tree.speculate([1, 2], 0, 3.0, 0.0) == ([], 0.0)


def test_max_tokens_caps():
    tree = tree_of([1, 2, 3, 4, 5, 6, 7, 8, 9], depth=16)
    assert tree.speculate([1, 2], 4, 10.0, 0.0) == ([3, 4, 5, 6], 4.0)
    assert tree.speculate([1, 2], 1, 10.0, 0.0) == ([3], 1.0)


def test_depth_limits_drafts_and_a_shorter_match_may_win():
    tree = tree_of([1, 2, 3, 4, 5, 6, 7, 8, 9], depth=4)
    # From (1, 2) at depth 2 the trie goes 2 deeper; from (2) at depth 1, 3 deeper.
    assert tree.speculate([1, 2], 10, 10.0, 0.0) == ([3, 4, 5], 3.0)


def test_longer_match_preferred_when_it_scores_higher():
    tree = tree_of([7, 1, 2, 7, 1, 2, 8, 1, 3])
    assert tree.speculate([1], 1, 1.0, 0.0) == ([2], 2 / 3)
    assert tree.speculate([8, 1], 1, 1.0, 0.0) == ([3], 1.0)
    # A miss at length m stops the search: nothing longer is tried.
    assert tree.speculate([9, 8, 1], 1, 1.0, 0.0) == ([3], 1.0)
    assert tree.speculate([4], 1, 1.0, 0.0) == ([], 0.0)
    assert tree.speculate([], 1, 1.0, 0.0) == ([], 0.0)


def test_pattern_longer_than_depth_is_cut():
    tree = tree_of([1, 2, 3, 4, 5, 1, 2], depth=3)
    # Cut to (5 1 2): that occurs, but at depth 3 it has no child; (1 2) reaches depth 3 in one
    # token, (2) in two: 3 once in 2, then 4 for sure.
    assert tree.speculate([9, 4, 5, 1, 2], 4, 4.0, 0.0) == ([3, 4], 1.0)
    assert tree.speculate([9, 4, 5, 1, 2], 4, 4.0, 0.0) == tree.speculate([5, 1, 2], 4, 4.0, 0.0)


def test_no_crossing_between_sequences():
    whole = tree_of([1, 2], [3, 4], depth=4)
    assert whole.num_nodes == 6                # (1) (2) (1 2) and (3) (4) (3 4)
    assert whole.speculate([2], 4, 4.0, 0.0) == ([], 0.0)
    assert whole.speculate([1], 4, 4.0, 0.0) == ([2], 1.0)
    pieces = SuffixTree(4)
    for seq_id, tokens in [(0, [1]), (1, [3]), (0, [2]), (1, [4])]:
        pieces.extend(seq_id, tokens)
    assert dump(pieces) == dump(whole)


def test_counts_match_the_definition():
    tree = tree_of([1, 1, 1, 1], depth=2)
    assert dump(tree) == {(1,): 4, (1, 1): 3}
    assert tree.speculate([1], 5, 5.0, 0.0) == ([1], 0.75)


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="max_depth"):
        SuffixTree(0)
    with pytest.raises(ValueError, match="max_depth"):
        SuffixCache(0, 4)
    with pytest.raises(ValueError, match="max_cached_requests"):
        SuffixCache(4, -1)


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_tail_of_the_last_sequence_matches_the_walk(depth):
    # speculate() reads the matches of the last-extended sequence's tail from its frontier;
    # the same pattern after another sequence is extended takes the walk from the root.
    rng = random.Random(depth)
    tree, ref = SuffixTree(depth), Reference(depth)
    seq: list[int] = []
    for step in range(60):
        piece = [rng.randrange(3) for _ in range(rng.randint(1, 3))]
        tree.extend(0, piece)
        ref.extend(0, piece)
        seq += piece
        for k in range(1, depth + 3):
            for args in [(8, 1.0, 0.0), (4, 2.0, 0.2)]:
                expected = ref.speculate(seq[-k:], *args)
                assert tree.speculate(seq[-k:], *args) == expected, (step, k, args)
    tree.extend(1, [5])
    ref.extend(1, [5])
    for k in range(1, depth + 3):
        assert tree.speculate(seq[-k:], 8, 1.0, 0.0) == ref.speculate(seq[-k:], 8, 1.0, 0.0)


# --- remove() --------------------------------------------------------------------------------


def patterns_of(rng: random.Random, seqs: list[list[int]], vocab: int,
                depth: int) -> list[list[int]]:
    out = [seq[-k:] for seq in seqs for k in range(1, depth + 1)]
    out += [[rng.randrange(vocab) for _ in range(rng.randint(1, depth))] for _ in range(40)]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_remove_oldest_matches_a_fresh_tree(seed):
    rng = random.Random(seed)
    depth, vocab = rng.randint(1, 6), rng.randint(2, 4)
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 40))] for _ in range(4)]
    tree = tree_of(*seqs, depth=depth)
    tree.remove(0)
    fresh = SuffixTree(depth)
    for i, seq in enumerate(seqs[1:], start=1):
        fresh.extend(i, seq)
    assert tree.num_nodes == fresh.num_nodes
    assert dump(tree) == dump(fresh)
    for pattern in patterns_of(rng, seqs, vocab, depth):
        for args in [(8, 1.0, 0.0), (8, 2.0, 0.3), (3, 0.5, 0.1)]:
            assert tree.speculate(pattern, *args) == fresh.speculate(pattern, *args)


@pytest.mark.parametrize("seed", range(20))
def test_remove_any_restores_counts_exactly(seed):
    rng = random.Random(100 + seed)
    depth, vocab = rng.randint(1, 6), rng.randint(2, 4)
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 40))] for _ in range(4)]
    tree = tree_of(*seqs, depth=depth)
    gone = rng.sample(range(4), 2)
    for i in gone:
        tree.remove(i)
    kept = [i for i in range(4) if i not in gone]
    fresh = SuffixTree(depth)
    for i in kept:
        fresh.extend(i, seqs[i])
    assert tree.num_nodes == fresh.num_nodes
    assert dump(tree) == dump(fresh)
    # Deleted nodes are reused: a new sequence still counts the same as in a fresh trie.
    extra = [rng.randrange(vocab) for _ in range(30)]
    tree.extend(9, extra)
    fresh.extend(9, extra)
    assert dump(tree) == dump(fresh)
    for i in kept + [9]:
        tree.remove(i)
    assert tree.num_nodes == 0 and dump(tree) == {}
    assert tree.speculate(extra, 8, 1.0, 0.0) == ([], 0.0)


def test_remove_unknown_raises():
    with pytest.raises(KeyError):
        SuffixTree(4).remove(3)


# --- SuffixCache -----------------------------------------------------------------------------


def finished(cache: SuffixCache, req_id: str, prompt: list[int], output: list[int]) -> None:
    cache.start(req_id, prompt)
    cache.append(req_id, output)
    cache.finish(req_id)


def test_cache_evicts_first_in_first_out():
    cache = SuffixCache(8, 2)
    finished(cache, "a", [0], [1, 2, 3])
    finished(cache, "b", [0], [4, 5, 6])
    assert cache.speculate("x", [1, 2], 4, 1.0, 0.0) == [3]
    finished(cache, "c", [0], [7, 8, 9])
    assert cache.speculate("x", [1, 2], 4, 1.0, 0.0) == []
    assert cache.speculate("x", [4, 5], 4, 1.0, 0.0) == [6]
    assert cache.speculate("x", [7, 8], 4, 1.0, 0.0) == [9]
    finished(cache, "d", [0], [])                # an empty output takes a slot too
    assert cache.speculate("x", [4, 5], 4, 1.0, 0.0) == []
    assert cache.speculate("x", [7, 8], 4, 1.0, 0.0) == [9]


def test_cache_keeps_outputs_not_prompts():
    cache = SuffixCache(8, 4)
    cache.start("a", [1, 2, 3])
    assert cache.active("a")
    cache.append("a", [4, 5])
    cache.append("a", [6])
    assert cache.speculate("a", [1, 2], 4, 1.0, 0.0) == [3, 4]   # the local tree
    cache.finish("a")
    assert not cache.active("a")
    assert cache.speculate("b", [1, 2], 4, 1.0, 0.0) == []
    assert cache.speculate("b", [4, 5], 4, 1.0, 0.0) == [6]


def test_cache_unknown_and_disabled():
    cache = SuffixCache(8, 0)
    cache.finish("nobody")
    finished(cache, "a", [0], [1, 2, 3])
    assert cache.speculate("b", [1, 2], 4, 1.0, 0.0) == []
    with pytest.raises(KeyError):
        cache.append("nobody", [1])


def test_cache_picks_the_better_draft_local_on_ties():
    cache = SuffixCache(8, 4)
    finished(cache, "g", [0], [1, 2, 4, 0, 1, 2])          # after (1 2): 4 once in 2
    cache.start("r", [5, 1, 2, 3, 6, 1, 2])                 # after (1 2): 3 once in 2
    assert cache.speculate("r", [1, 2], 1, 1.0, 0.0) == [3]
    finished(cache, "h", [0], [1, 2, 4])                    # the global tree: 4 twice in 3
    assert cache.speculate("r", [1, 2], 1, 1.0, 0.0) == [4]
    cache.append("r", [3])                                  # local: 3 twice in 3, a tie again
    assert cache.speculate("r", [6, 1, 2], 1, 1.0, 0.0) == [3]


# --- against the brute-force reference -------------------------------------------------------


def test_random_against_brute_force():
    rng = random.Random(1234)
    checked = 0
    for _ in range(300):
        depth, vocab = rng.randint(1, 6), rng.randint(1, 4)
        tree, ref = SuffixTree(depth), Reference(depth)
        seqs: dict[int, list[int]] = defaultdict(list)
        for _ in range(rng.randint(1, 6)):                  # interleaved pieces of 1-3 sequences
            seq_id = rng.randrange(3)
            piece = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
            tree.extend(seq_id, piece)
            ref.extend(seq_id, piece)
            seqs[seq_id] += piece
        assert dump(tree) == ref.counts
        for _ in range(8):
            if rng.random() < 0.5 and any(seqs.values()):
                seq = rng.choice([s for s in seqs.values() if s])
                pattern = seq[-rng.randint(1, depth + 2):]
            else:
                pattern = [rng.randrange(vocab) for _ in range(rng.randint(0, depth + 2))]
            args = (rng.randint(0, 8), rng.choice([0.5, 1.0, 1.5, 3.0]),
                    rng.choice([0.0, 0.1, 0.25, 0.5]))
            assert tree.speculate(pattern, *args) == ref.speculate(pattern, *args), (pattern, args)
            checked += 1
    assert checked == 2400


def test_drop_forgets_a_request_and_clear_global_empties_the_cache():
    cache = SuffixCache(max_depth=4, max_cached_requests=4)
    cache.start("a", [1, 2, 3])
    cache.append("a", [9, 9])
    cache.drop("a")
    assert not cache.active("a")
    cache.drop("unknown")
    cache.start("b", [5])
    assert cache.speculate("b", [1, 2, 3], 4, 4.0, 0.0) == []  # "a" left nothing behind
    cache.append("b", [6, 7])
    cache.finish("b")
    assert cache.speculate("c", [5], 4, 4.0, 0.0) == []  # outputs only: 5 was b's prompt
    assert cache.speculate("c", [6], 4, 4.0, 0.0) == [7]
    cache.clear_global()
    assert cache.speculate("c", [6], 4, 4.0, 0.0) == []
