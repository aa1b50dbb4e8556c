"""Sampler: chi-square goodness of fit per sampling setting (with planted bugs the same test must
reject), greedy rows, seeding and batch invariance, and logprobs."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

import tandem.sample.sampler as sampler_mod
from tandem.sample import Sampler, SamplingMetadata, compute_logprobs, compute_probs
from tandem.sampling_params import SamplingParams

from . import ALPHA, CountingRandom, chi2_pvalue, make_md, ref_probs

VOCAB = 32
NUM_SAMPLES = 20_000
LOGITS = torch.tensor(np.random.default_rng(7).normal(0.0, 1.5, VOCAB), dtype=torch.float32)


# Planted bugs: plausible wrong versions of compute_probs, swapped into the real Sampler.
def _no_top_p(logits: torch.Tensor, md: SamplingMetadata, apply_penalty: bool = True):
    md.top_p = torch.ones_like(md.top_p)
    return compute_probs(logits, md, apply_penalty)


def _top_k_off_by_one(logits: torch.Tensor, md: SamplingMetadata, apply_penalty: bool = True):
    md.top_k = md.top_k + 1
    return compute_probs(logits, md, apply_penalty)


def _min_p_not_scaled_by_max(logits: torch.Tensor, md: SamplingMetadata,
                             apply_penalty: bool = True):
    probs = torch.softmax(logits / md.temperature.unsqueeze(1), dim=-1)
    probs = probs * (probs >= md.min_p.unsqueeze(1))
    return probs / probs.sum(-1, keepdim=True)


def _temperature_ignored(logits: torch.Tensor, md: SamplingMetadata, apply_penalty: bool = True):
    return torch.softmax(logits, dim=-1)


SETTINGS = [  # (id, params, planted bug, first generator seed)
    ("t0.8-top_p0.95", dict(temperature=0.8, top_p=0.95), _no_top_p, 1_000_000),
    ("top_k5", dict(top_k=5), _top_k_off_by_one, 2_000_000),
    ("min_p0.1", dict(min_p=0.1), _min_p_not_scaled_by_max, 3_000_000),
    ("t1.3", dict(temperature=1.3), _temperature_ignored, 4_000_000),
]


def _sample_counts(kw: dict, seed_base: int) -> np.ndarray:
    """NUM_SAMPLES draws from identical rows, one seeded generator per row."""
    md = make_md([SamplingParams(**kw)] * NUM_SAMPLES,
                 list(range(seed_base, seed_base + NUM_SAMPLES)))
    tokens = Sampler()(LOGITS.expand(NUM_SAMPLES, VOCAB), md).sampled_token_ids
    return np.bincount(tokens.numpy(), minlength=VOCAB)


@pytest.mark.parametrize("name,kw,planted,seed", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_chi_square_fits_and_planted_bug_is_rejected(
        name: str, kw: dict, planted: Callable, seed: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Fixed seeds keep CI deterministic; at alpha = 1e-3 a correct sampler fails one seed in 1000.
    expected = ref_probs(LOGITS.numpy(), **kw)
    counts = _sample_counts(kw, seed)
    p_value = chi2_pvalue(counts, expected)
    print(f"{name}: correct p={p_value:.3g}", end="; ")
    assert p_value > ALPHA, f"{name}: correct sampler rejected (p={p_value:.3g})"
    assert counts[expected == 0].sum() == 0, "sampled a token the filters removed"

    monkeypatch.setattr(sampler_mod, "compute_probs", planted)
    bug_counts = _sample_counts(kw, seed)
    bug_p = chi2_pvalue(bug_counts, expected)
    print(f"planted {planted.__name__} p={bug_p:.3g}")
    assert bug_p < ALPHA, f"{name}: the test cannot see {planted.__name__} (p={bug_p:.3g})"


def test_greedy_rows_take_penalised_argmax_and_draw_nothing() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.9, 0.0]] * 3)
    params = [SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, presence_penalty=0.5),   # 3.0 - 0.5 < 2.9
              SamplingParams(temperature=1.0)]
    md = make_md(params, [1, 2, 3], output_token_ids=[[1], [1], []])
    md.rngs = [CountingRandom(s) for s in (1, 2, 3)]
    out = Sampler()(logits, md)
    assert out.sampled_token_ids[:2].tolist() == [1, 2]
    assert out.sampled_token_ids.dtype == torch.int64 and out.logprobs is None
    assert [r.calls for r in md.rngs] == [0, 0, 1]


def test_seeded_rows_are_reproducible_and_batch_invariant() -> None:
    gen = np.random.default_rng(3)
    vocab = 40
    target = torch.tensor(gen.normal(0, 2, vocab), dtype=torch.float32)
    params = SamplingParams(temperature=0.9, top_p=0.9)
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=3),
              SamplingParams(temperature=0.7, frequency_penalty=1.0)]
    for seed in range(30):
        alone = Sampler()(target.unsqueeze(0), make_md([params], [seed])).sampled_token_ids
        batch_logits = torch.tensor(gen.normal(0, 2, (4, vocab)), dtype=torch.float32)
        batch_logits[2] = target
        batch = make_md([others[0], others[1], params, others[2]], [seed + 1, 999, seed, 5],
                        output_token_ids=[[], [], [], [1, 2]])
        mixed = Sampler()(batch_logits, batch).sampled_token_ids
        assert int(mixed[2]) == int(alone[0]), f"seed {seed}: depends on the batch"
    draws = [Sampler()(target.expand(8, vocab), make_md([params] * 8, list(range(8))))
             .sampled_token_ids for _ in range(2)]
    assert torch.equal(draws[0], draws[1])


def test_sample_from_probs_respects_zero_mass() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]]).repeat(500, 1)
    tokens = sampler_mod.sample_from_probs(probs, make_md([SamplingParams()] * 1000,
                                                          list(range(1000))))
    assert set(tokens[0::2].tolist()) == {1, 3} and set(tokens[1::2].tolist()) == {2}


def test_logprobs_are_raw_log_softmax() -> None:
    gen = np.random.default_rng(11)
    logits = torch.tensor(gen.normal(0, 3, (6, 25)), dtype=torch.float32)
    logits[5, :] = 0.0
    logits[5, [3, 7]] = 4.0  # a tie at the top
    chosen = torch.tensor([0, 5, 24, 13, 2, 7])
    out = compute_logprobs(logits, chosen, num_logprobs=4)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert out.token_ids.shape == (6, 5) and out.logprobs.dtype == torch.float32
    assert out.token_ids[:, 0].tolist() == chosen.tolist()
    torch.testing.assert_close(out.logprobs.double(), reference.gather(1, out.token_ids),
                               atol=1e-5, rtol=0)
    for i in range(6):
        order = torch.argsort(reference[i], descending=True, stable=True)
        assert set(out.token_ids[i, 1:].tolist()) == set(order[:4].tolist()) or i == 5
        assert out.logprobs[i, 1:].tolist() == sorted(out.logprobs[i, 1:].tolist(), reverse=True)
        # vLLM: rank = number of tokens at least as likely as the chosen one.
        assert int(out.ranks[i]) == int((reference[i] >= reference[i, chosen[i]]).sum())
    assert int(out.ranks[5]) == 2  # tied with token 3
    assert compute_logprobs(logits, chosen, 0).token_ids.shape == (6, 1)
    assert compute_logprobs(logits, chosen, -1).token_ids.shape == (6, 26)


def test_sampler_logprobs_ignore_penalties_and_temperature() -> None:
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0], [0.5, 2.0, -1.0, 1.0]])
    md = make_md([SamplingParams(temperature=0.0, repetition_penalty=3.0),
                  SamplingParams(temperature=0.3, top_k=1)], [0, 1],
                 output_token_ids=[[1], []])
    out = Sampler()(logits, md, num_logprobs=2)
    assert out.sampled_token_ids.tolist() == [3, 1]  # 2.0 / 3 < 1.0 for the greedy row
    raw = torch.log_softmax(logits, dim=-1)
    assert out.logprobs.token_ids.tolist() == [[3, 1, 3], [1, 1, 3]]
    torch.testing.assert_close(out.logprobs.logprobs, raw.gather(1, out.logprobs.token_ids))
    assert out.logprobs.ranks.tolist() == [2, 1]
