"""RejectionSampler: greedy unit cases, goodness of fit against the target (one position and a
3-draft Markov chain), acceptance rates, planted bugs the same tests must reject, seeding, batch
invariance and draft-prefix penalties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tandem.sample import RejectionSampler, Sampler
from tandem.sample.random import SeededRandom
from tandem.sampling_params import SamplingParams

from . import ALPHA, CountingRandom, chi2_pvalue, make_md

GREEDY = SamplingParams(temperature=0.0)
RANDOM = SamplingParams(temperature=1.0)


class ResampleFromTarget(RejectionSampler):
    """Planted bug: on rejection, sample p instead of max(p - q, 0)."""

    @staticmethod
    def recovery_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return p


class InvertedRatio(RejectionSampler):
    """Planted bug: accept with min(1, q/p) instead of min(1, p/q)."""

    @staticmethod
    def accept_draft(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return u * p_x < q_x


PLANTED = [ResampleFromTarget, InvertedRatio]


def _argmax_rows(tokens: list[int], vocab: int = 10) -> torch.Tensor:
    rows = torch.zeros(len(tokens), vocab)  # [n, V]
    rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return rows


# ----------------------------------------------------------------------------- greedy cases


@pytest.mark.parametrize("drafts,target,expected,accepted", [
    ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),   # perfect match + bonus
    ([1, 2, 3], [1, 5, 3, 4], [1, 5], 1),          # early mismatch emits the target argmax
    ([1, 2, 3], [6, 2, 3, 4], [6], 0),
    ([], [7], [7], 0),                             # k = 0: plain decoding
    ([1, -1, 3], [1, 2, 3, 4], [1, 2], 1),         # an invalid draft id is rejected
])
def test_greedy_single(drafts: list[int], target: list[int], expected: list[int],
                       accepted: int) -> None:
    md = make_md([GREEDY], [0])
    md.rngs = [CountingRandom(0)]
    out = RejectionSampler()(_argmax_rows(target), [len(drafts)], [drafts], None, md)
    assert out.token_ids == [expected] and out.num_accepted == [accepted]
    assert md.rngs[0].calls == 0  # greedy uses no randomness


def test_greedy_several_requests() -> None:
    drafts = [[1, 2], [3], [], [4, 5, 6]]
    target = [1, 2, 9] + [8, 0] + [7] + [4, 5, 6, 2]
    md = make_md([GREEDY] * 4, [0, 1, 2, 3])
    out = RejectionSampler()(_argmax_rows(target), [2, 1, 0, 3], drafts, None, md)
    assert out.token_ids == [[1, 2, 9], [8], [7], [4, 5, 6, 2]]
    assert out.num_accepted == [2, 0, 0, 3]
    q = torch.full((6, 10), 0.1)  # draft probabilities are irrelevant to greedy requests
    assert RejectionSampler()(_argmax_rows(target), [2, 1, 0, 3], drafts, q, md) == out


def test_no_drafts_equals_plain_sampler() -> None:
    logits = torch.tensor(np.random.default_rng(0).normal(0, 2, (5, 30)), dtype=torch.float32)
    params = [SamplingParams(temperature=0.7, top_p=0.9), GREEDY, RANDOM,
              SamplingParams(top_k=4), SamplingParams(min_p=0.2, temperature=1.4)]
    for seed in range(10):
        seeds = [seed * 10 + i for i in range(5)]
        plain = Sampler()(logits, make_md(params, seeds)).sampled_token_ids.tolist()
        spec = RejectionSampler()(logits, [0] * 5, [[]] * 5, None, make_md(params, seeds))
        assert spec.token_ids == [[t] for t in plain] and spec.num_accepted == [0] * 5


def test_edge_cases_q_equals_p_and_disjoint_support() -> None:
    n, vocab = 200, 6
    p = torch.tensor([0.3, 0.3, 0.4, 0.0, 0.0, 0.0])
    logits = torch.log(p).expand(2 * n, vocab).contiguous()  # draft row + bonus row each
    drafts = [[int(x)] for x in torch.multinomial(p, n, replacement=True)]
    md = make_md([RANDOM] * n, list(range(n)))
    same = RejectionSampler()(logits, [1] * n, drafts, p.expand(n, vocab), md)
    assert same.num_accepted == [1] * n  # q = p: always accepted
    q_far = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.5, 0.0])
    far_drafts = [[3 + i % 2] for i in range(n)]
    far = RejectionSampler()(logits, [1] * n, far_drafts, q_far.expand(n, vocab), md)
    assert far.num_accepted == [0] * n  # disjoint: never accepted, recovered from p
    assert {t[0] for t in far.token_ids} == {0, 1, 2}


def test_outputs_respect_target_top_k() -> None:
    n, vocab = 300, 12
    logits = torch.tensor(np.random.default_rng(5).normal(0, 1, vocab), dtype=torch.float32)
    allowed = set(torch.topk(logits, 3).indices.tolist())
    uniform = torch.full((3 * n, vocab), 1.0 / vocab)
    drafts = torch.randint(0, vocab, (n, 3), generator=torch.Generator().manual_seed(0)).tolist()
    md = make_md([SamplingParams(top_k=3)] * n, list(range(n)))
    out = RejectionSampler()(logits.expand(4 * n, vocab), [3] * n, drafts, uniform, md)
    assert {t for seq in out.token_ids for t in seq} <= allowed
    assert any(a > 0 for a in out.num_accepted)


# ----------------------------------------------------------------------------- goodness of fit

V20 = 20
N_SINGLE = 100_000


def _random_dist(rng: np.random.Generator, vocab: int, scale: float) -> np.ndarray:
    z = rng.normal(0.0, scale, vocab)
    return np.exp(z) / np.exp(z).sum()


def _single_position(sampler: RejectionSampler, one_hot_q: bool, seed: int):
    """N requests with one draft each; returns (first-token counts, #accepted, p, expected
    acceptance, bonus counts among accepted requests, bonus distribution)."""
    rng = np.random.default_rng(seed)
    p, q, bonus = (_random_dist(rng, V20, 1.2) for _ in range(3))
    if one_hot_q:
        drafts = np.full(N_SINGLE, int(np.argmax(q)))  # greedy drafting: q(x) = 1
        draft_probs, expected_accept = None, p[drafts[0]]
    else:
        drafts = rng.choice(V20, size=N_SINGLE, p=q)
        draft_probs = torch.tensor(q, dtype=torch.float32).expand(N_SINGLE, V20)
        expected_accept = np.minimum(p, q).sum()
    rows = torch.tensor(np.log(np.stack([p, bonus])), dtype=torch.float32)  # [2, V]
    logits = rows.repeat(N_SINGLE, 1)                                         # [2N, V]
    md = make_md([RANDOM] * N_SINGLE, [seed * N_SINGLE + i for i in range(N_SINGLE)])
    out = sampler(logits, [1] * N_SINGLE, [[int(x)] for x in drafts], draft_probs, md)
    first = np.array([t[0] for t in out.token_ids])
    bonus_tokens = np.array([t[1] for t in out.token_ids if len(t) == 2])
    return (np.bincount(first, minlength=V20), sum(out.num_accepted), p, expected_accept,
            np.bincount(bonus_tokens, minlength=V20), bonus)


@pytest.mark.parametrize("one_hot_q", [False, True], ids=["probabilistic-q", "one-hot-q"])
def test_single_position_matches_target(one_hot_q: bool) -> None:
    counts, accepted, p, expected_accept, bonus_counts, bonus = _single_position(
        RejectionSampler(), one_hot_q, seed=1)
    p_value = chi2_pvalue(counts, p)
    accept_p = stats.binomtest(accepted, N_SINGLE, expected_accept).pvalue
    bonus_p = chi2_pvalue(bonus_counts, bonus)
    print(f"correct: chi2 p={p_value:.3g} acceptance {accepted / N_SINGLE:.4f} vs "
          f"{expected_accept:.4f} (p={accept_p:.3g}) bonus p={bonus_p:.3g}")
    assert p_value > ALPHA and accept_p > ALPHA and bonus_p > ALPHA


@pytest.mark.parametrize("planted", PLANTED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("one_hot_q", [False, True], ids=["probabilistic-q", "one-hot-q"])
def test_single_position_rejects_planted_bug(one_hot_q: bool, planted: type) -> None:
    counts, _, p, _, _, _ = _single_position(planted(), one_hot_q, seed=1)
    p_value = chi2_pvalue(counts, p)
    print(f"{planted.__name__}: chi2 p={p_value:.3g}")
    assert p_value < ALPHA


def _markov_run(sampler: RejectionSampler, one_hot_q: bool, n: int = 30_000, k: int = 3):
    """Generate 2 tokens per sequence through draft-then-verify steps with a Markov target
    p(.|prev) and a different Markov draft q(.|prev); returns the [V, V] joint counts, the
    exact target joint and the fraction of sequences whose first step accepted >= 1 draft."""
    vocab, start = 6, 6  # state 6 is the start-of-sequence context
    rng = np.random.default_rng(42)
    target = np.stack([_random_dist(rng, vocab, 1.5) for _ in range(vocab + 1)])  # [V+1, V]
    # A draft that roughly agrees with the target, as a real one does.
    draft = target * np.exp(rng.normal(0.0, 0.8, target.shape))                  # [V+1, V]
    draft /= draft.sum(axis=1, keepdims=True)
    log_target = torch.tensor(np.log(target), dtype=torch.float32)
    rngs = [SeededRandom(10_000_000 + i) for i in range(n)]
    seqs: list[list[int]] = [[] for _ in range(n)]
    first_step_accepts = None
    while active := [i for i in range(n) if len(seqs[i]) < 2]:
        prev = np.array([seqs[i][-1] if seqs[i] else start for i in active])
        contexts, drafts = [prev], []
        for _ in range(k):  # draft autoregressively from q(.|context)
            if one_hot_q:
                x = draft[contexts[-1]].argmax(axis=1)
            else:
                cdf = draft[contexts[-1]].cumsum(axis=1)
                x = np.minimum((rng.random(len(active))[:, None] > cdf).sum(axis=1), vocab - 1)
            drafts.append(x)
            contexts.append(x)
        ctx = np.stack(contexts, axis=1)                                          # [A, k+1]
        logits = log_target[torch.tensor(ctx.reshape(-1))]                      # [A*(k+1), V]
        q = None if one_hot_q else torch.tensor(
            draft[ctx[:, :k].reshape(-1)], dtype=torch.float32)                   # [A*k, V]
        md = make_md([RANDOM] * len(active), [0] * len(active),
                     positions=[len(seqs[i]) for i in active])
        md.rngs = [rngs[i] for i in active]  # one per sequence, keyed by its positions
        out = sampler(logits, [k] * len(active), np.stack(drafts, axis=1).tolist(), q, md)
        for i, toks in zip(active, out.token_ids):
            seqs[i] += toks
        if first_step_accepts is None:
            first_step_accepts = np.mean(np.array(out.num_accepted) > 0)
    joint = np.zeros((vocab, vocab))
    np.add.at(joint, (np.array([s[0] for s in seqs]), np.array([s[1] for s in seqs])), 1)
    exact = target[start][:, None] * target[:vocab]                              # [V, V]
    return joint, exact, first_step_accepts


@pytest.mark.parametrize("one_hot_q", [False, True], ids=["probabilistic-q", "one-hot-q"])
def test_three_drafts_joint_of_first_two_tokens(one_hot_q: bool) -> None:
    joint, exact, accepts = _markov_run(RejectionSampler(), one_hot_q)
    p_value = chi2_pvalue(joint, exact)
    print(f"joint chi2: correct p={p_value:.3g} (first step accepted a draft in {accepts:.0%})",
          end="")
    assert accepts > 0.2  # both tokens often come from accepted drafts, not only recoveries
    assert p_value > ALPHA
    for planted in PLANTED:
        bug_p = chi2_pvalue(_markov_run(planted(), one_hot_q)[0], exact)
        print(f", {planted.__name__} p={bug_p:.3g}", end="")
        assert bug_p < ALPHA, planted.__name__
    print()


# ----------------------------------------------------------------------------- seeding, penalties


def _mixed_batch(seed: int, include_others: bool):
    """Request A (random, k=3, probabilistic q), optionally surrounded by other requests."""
    g = np.random.default_rng(seed)
    vocab = 16
    a_logits = torch.tensor(g.normal(0, 1, (4, vocab)), dtype=torch.float32)
    a_q = torch.softmax(torch.tensor(g.normal(0, 1, (3, vocab)), dtype=torch.float32), -1)
    a_drafts = [int(g.choice(vocab, p=row / row.sum())) for row in a_q.double().numpy()]
    a_params = SamplingParams(temperature=0.9, top_p=0.95, presence_penalty=0.3)
    if not include_others:
        return a_logits, [3], [a_drafts], a_q, make_md([a_params], [seed]), 0
    others_logits = torch.tensor(g.normal(0, 1, (3 + 2 + 1, vocab)), dtype=torch.float32)
    logits = torch.cat([others_logits[:3], a_logits, others_logits[3:]])
    q = torch.cat([torch.full((2, vocab), 1 / vocab), a_q, torch.full((1, vocab), 1 / vocab)])
    md = make_md([GREEDY, a_params, SamplingParams(top_k=5), RANDOM],
                 [seed + 1, seed, seed + 2, seed + 3], output_token_ids=[[1], [], [2], []])
    return logits, [2, 3, 1, 0], [[4, 5], a_drafts, [6], []], q, md, 1


def test_seeded_determinism_and_batch_invariance() -> None:
    for seed in range(20):
        alone_args = _mixed_batch(seed, include_others=False)
        alone = RejectionSampler()(*alone_args[:5])
        again = RejectionSampler()(*_mixed_batch(seed, include_others=False)[:5])
        assert alone == again
        args = _mixed_batch(seed, include_others=True)
        mixed = RejectionSampler()(*args[:5])
        assert mixed.token_ids[args[5]] == alone.token_ids[0], f"seed {seed}"
        assert RejectionSampler()(*_mixed_batch(seed, include_others=True)[:5]) == mixed


def test_penalties_use_the_draft_prefix() -> None:
    row = torch.tensor([3.0, 2.9, 0.0, 0.0, 0.0])
    logits = row.expand(4, 5)
    # Greedy: at position 1 the prefix [0] halves token 0's logit, so the argmax becomes 1.
    greedy = make_md([SamplingParams(temperature=0.0, repetition_penalty=2.0)], [0])
    out = RejectionSampler()(logits, [3], [[0, 0, 0]], None, greedy)
    assert out.token_ids == [[0, 1]] and out.num_accepted == [1]
    # Without the penalty the same drafts are all accepted.
    plain = RejectionSampler()(logits, [3], [[0, 0, 0]], None, make_md([GREEDY], [0]))
    assert plain.token_ids == [[0, 0, 0, 0]]
    # Random (top_k=1 makes p one-hot): position 1 must see token 0 as seen -> p(0) = 0 there.
    for seed in range(20):
        md = make_md([SamplingParams(top_k=1, repetition_penalty=2.0)], [seed])
        out = RejectionSampler()(logits, [3], [[0, 0, 1]], None, md)
        assert out.token_ids == [[0, 1]] and out.num_accepted == [1]
    # Output tokens so far count too: token 0 already generated -> rejected at position 0.
    md = make_md([SamplingParams(temperature=0.0, repetition_penalty=2.0)], [0],
                 output_token_ids=[[0]])
    assert RejectionSampler()(logits, [3], [[0, 0, 0]], None, md).token_ids == [[1]]
