"""Synthetic acceptance, for benchmarking only (vLLM's rejection_sample_method "synthetic").

Draft j of a request is accepted with a set probability, given that the drafts before it were,
whatever the target thinks of it, so speed can be measured on random-weight models shaped like
real ones at a chosen acceptance. The output is NOT the target's distribution: this mode is not
lossless, and the server refuses it unless started with --allow-synthetic-acceptance.
"""

from __future__ import annotations

import random

import torch

from tandem.sample.rejection_sampler import RejectionSampler, _Layout


def conditional_rates(rates: list[float]) -> list[float]:
    """Per-position acceptance rates P(position j accepted) -> P(j accepted | all before were)."""
    out, before = [], 1.0
    for r in rates:
        out.append(r / before if before > 0 else 0.0)
        before = r
    return out


def rates_for_length(length: float, k: int) -> list[float]:
    """Per-position rates r^1..r^k (one conditional rate r) whose mean acceptance length
    1 + r + ... + r^k equals `length` (in [1, k + 1]), by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        r = (lo + hi) / 2
        if sum(r ** i for i in range(k + 1)) < length:
            lo = r
        else:
            hi = r
    r = (lo + hi) / 2
    return [r ** (i + 1) for i in range(k)]


class SyntheticRejectionSampler(RejectionSampler):
    def __init__(self, rates: list[float], seed: int = 0) -> None:
        self.conditional = conditional_rates(rates)
        self._rng = random.Random(seed)

    def _accepted(self, target_argmax: torch.Tensor, probs: torch.Tensor | None,
                  draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                  is_greedy: list[bool], layout: _Layout, uniforms: torch.Tensor) -> list[bool]:
        out: list[bool] = []
        for drafts in draft_token_ids:
            for j in range(len(drafts)):
                rate = self.conditional[j] if j < len(self.conditional) else 0.0
                out.append(self._rng.random() < rate)
        return out
