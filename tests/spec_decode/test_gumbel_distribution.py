"""Gumbel-max sampling draws from the target's exact distribution, plain and speculative.

Plain: the Sampler under "gumbel" (what an engine under "gumbel" samples without drafts) over 40,000 rows of one 40-token distribution (penalised,
temperature 0.8, top-p 0.95), each row its own seed, against a float64 reference by chi-square.
Speculative: the 24-token pair and exact law of the first three tokens of
test_spec_distribution.py, k = 2 and a partly-agreeing draft, through the engine.
Planted bugs must fail: Exponential instead of Gumbel noise (plain), and noise keyed by the row's
offset inside its step instead of its output position (the first token a verification emits then
reads the noise of the token the step before emitted).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import cpu_sampling
from tandem.sample import gumbel, gumbel_verifier
from tandem.sample.sampler import Sampler
from test_spec_distribution import ALPHA, PROMPT, TEMPERATURE, TOP_P, _pvalue
from test_spec_distribution import exact, pair  # noqa: F401 - fixtures
from sample import chi2_pvalue, make_md

NUM_ROWS = 40_000
NUM_SEQUENCES = 6_000  # speculative: fewer than test_spec_distribution's, the bugs are gross


def _plain_counts(vocab: int = 40) -> tuple[np.ndarray, np.ndarray]:
    torch.manual_seed(0)
    logits = torch.randn(vocab) * 2.0
    params = SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, presence_penalty=0.5)
    md = make_md([params] * NUM_ROWS, list(range(NUM_ROWS)), output_token_ids=[[0, 1]] * NUM_ROWS,
                 positions=[i % 7 for i in range(NUM_ROWS)])
    tokens = Sampler("gumbel")(logits.expand(NUM_ROWS, vocab), md).sampled_token_ids
    # Reference in float64: presence penalty on tokens 0 and 1, temperature, top-p.
    ref = logits.double().clone()
    ref[:2] -= 0.5
    p = torch.softmax(ref / TEMPERATURE, dim=-1).numpy()
    order = np.argsort(-p, kind="stable")
    keep = order[(np.cumsum(p[order]) - p[order]) < TOP_P]
    exact_p = np.zeros_like(p)
    exact_p[keep] = p[keep] / p[keep].sum()
    return np.bincount(tokens.numpy(), minlength=vocab), exact_p


def _path(monkeypatch, path: str) -> None:
    """Gumbel-max by the C kernel (kernels/cpu_gumbel.c, what engines run) or by torch ops."""
    if path == "torch":
        monkeypatch.setattr(cpu_sampling, "gumbel_candidates", lambda *args: None)
        monkeypatch.setattr(cpu_sampling, "gumbel_argmax_sparse", lambda *args: None)
        return
    cpu_kernels.configure(torch.device("cpu"))
    if not cpu_kernels.enabled():
        pytest.skip("the C kernels are off here")


@pytest.mark.parametrize("path", ["c", "torch"])
def test_plain_gumbel_sampler_matches_its_distribution(monkeypatch, path):
    _path(monkeypatch, path)
    counts, exact_p = _plain_counts()
    assert chi2_pvalue(counts, exact_p) > ALPHA


def test_planted_exponential_noise_is_detected(monkeypatch):
    _path(monkeypatch, "torch")  # the planted noise replaces the torch path's
    def exponential(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        lo, hi = keys & gumbel._M32, (keys >> 32) & gumbel._M32
        x = gumbel._h32(gumbel._h32(tokens ^ lo) ^ hi)
        return -torch.log((x.double() + 0.5) * gumbel._SCALE)  # Exp(1), not Gumbel

    monkeypatch.setattr(gumbel, "noise", exponential)
    counts, exact_p = _plain_counts()
    assert chi2_pvalue(counts, exact_p) < ALPHA


def _speculative(pair) -> tuple[np.ndarray, float]:  # noqa: F811
    llm = LLM(pair[0], seed=1234, speculative_config={
        "model": pair[1], "num_speculative_tokens": 2, "adaptive": False,
        "rejection_sample_method": "gumbel"})
    outs = llm.generate([PROMPT] * 2, SamplingParams(n=NUM_SEQUENCES // 2,
                                                     temperature=TEMPERATURE, top_p=TOP_P,
                                                     max_tokens=3, ignore_eos=True),
                        use_tqdm=False)
    stats = [out.spec_decode_stats for out in outs]
    return (np.array([c.token_ids[:3] for out in outs for c in out.outputs]),
            sum(s.num_accepted_tokens for s in stats) / sum(s.num_draft_tokens for s in stats))


def test_speculative_gumbel_matches_target_distribution(pair, exact):  # noqa: F811
    samples, acceptance = _speculative(pair)
    assert 0.1 < acceptance < 0.95  # rejections happen, so the mismatch path is tested
    assert _pvalue(samples, exact) > ALPHA


def keys_by_offset_in_step(md, device) -> torch.Tensor:
    """Planted: noise keyed by a row's offset within its verify step, not by its position."""
    first = {}
    for r, p in zip(md.rngs, md.positions):  # expand() lists a request's rows in order
        first.setdefault(id(r), p)
    return torch.tensor([gumbel._signed(r.noise_key(p - first[id(r)]))
                         for r, p in zip(md.rngs, md.positions)],
                        dtype=torch.int64, device=device)


def test_planted_noise_keyed_by_offset_in_step_is_detected(pair, exact, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gumbel_verifier, "row_keys", keys_by_offset_in_step)
    samples, _ = _speculative(pair)
    assert _pvalue(samples, exact) < ALPHA
