"""Shared helpers for the sampler tests: a plain NumPy reference of the intended distribution, a
chi-square goodness-of-fit p-value and a metadata builder."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from tandem.sample import SamplingMetadata
from tandem.sample.random import SeededRandom
from tandem.sampling_params import SamplingParams

ALPHA = 1e-3


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square GOF of observed `counts` against `probs`. Bins whose expected count is below 5
    (zero-probability ones included) are merged, smallest first, until the merged bin reaches 5;
    a sample in a zero-probability bin therefore weighs heavily instead of being ignored."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    expected = probs / probs.sum() * n
    order = np.argsort(expected, kind="stable")
    merged_obs, merged_exp, cut = 0.0, 0.0, 0
    while cut < len(order) and expected[order[0]] < 5.0 and (
            merged_exp < 5.0 or expected[order[cut]] < 5.0):
        merged_obs += counts[order[cut]]
        merged_exp += expected[order[cut]]
        cut += 1
    obs = np.concatenate([[merged_obs], counts[order[cut:]]]) if cut else counts[order]
    exp = np.concatenate([[merged_exp], expected[order[cut:]]]) if cut else expected[order]
    assert len(obs) >= 2, "too few bins for a chi-square test"
    exp = exp * (obs.sum() / exp.sum())  # scipy wants the sums to match to ~1e-8
    return float(stats.chisquare(obs, exp).pvalue)


def make_md(params: list[SamplingParams], seeds: list[int],
            output_token_ids: list[list[int]] | None = None,
            prompt_token_ids: list[list[int]] | None = None,
            positions: list[int] | None = None) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata.from_params(
        params,
        output_token_ids if output_token_ids is not None else [[] for _ in range(n)],
        prompt_token_ids if prompt_token_ids is not None else [[] for _ in range(n)],
        [SeededRandom(s) for s in seeds], torch.device("cpu"), positions)


class CountingRandom(SeededRandom):
    """A SeededRandom that counts the uniforms asked of it."""

    __slots__ = ("calls",)

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.calls = 0

    def uniform(self, position: int, purpose) -> float:
        self.calls += 1
        return super().uniform(position, purpose)


def ref_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> np.ndarray:
    """The intended distribution, written as plainly as possible in float64: softmax(l / T), drop
    p < min_p * max p, keep the k most likely (ties: lower id first), renormalise, keep tokens in
    sorted order until their mass reaches top_p, renormalise."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = p >= min_p * p.max()
    order = np.argsort(-p, kind="stable")
    if top_k > 0:
        keep &= np.isin(np.arange(len(p)), order[:top_k])
    if top_p < 1.0:
        q = p * keep / (p * keep).sum()
        chosen, mass = [], 0.0
        for t in order:
            if not keep[t]:
                continue
            chosen.append(t)
            mass += q[t]
            if mass >= top_p:
                break
        keep &= np.isin(np.arange(len(p)), chosen)
    out = p * keep
    return out / out.sum()
