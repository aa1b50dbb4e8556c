"""Sampler: one token per row from target logits (plain decoding), and the building blocks the
rejection sampler and the draft proposer share: `sample_from_probs` (keyed inverse CDF) and
`sample_by_method` (that, or Gumbel-max for the rows the rejection method couples)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tandem.sample.gumbel import coupled_rows, gumbel_sample, row_keys
from tandem.sample.logits_processing import apply_penalties, compute_probs, greedy_tokens
from tandem.sample.logprobs import LogprobsTensors, compute_logprobs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.random import Purpose


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights: [B, V] non-negative (need not sum to 1); u: [B] float64 in [0, 1). Returns [B]
    int64: the first token whose float64 cumulative weight exceeds u * total, so a token of zero
    weight is never chosen."""
    cdf = weights.double().cumsum(dim=-1)                                     # [B, V]
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(1)                     # [B, 1]
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)            # [B]
    return index.clamp_max_(weights.shape[-1] - 1)


def sample_from_probs(probs: torch.Tensor, md: SamplingMetadata,
                      purpose: Purpose = Purpose.SAMPLE) -> torch.Tensor:
    """[B, V] probabilities -> [B] int64 samples, row i drawn with md's uniform for `purpose` at
    its position (one uniform per row, cheaper than an exponential race over V numbers)."""
    if probs.shape[0] != md.num_rows:
        raise ValueError(f"need one metadata row per probability row: {probs.shape[0]} rows, "
                         f"{md.num_rows} in the metadata.")
    if probs.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=probs.device)
    return inverse_cdf(probs, md.uniforms(purpose))


GumbelDraw = Callable[[torch.Tensor, SamplingMetadata], torch.Tensor]


def gumbel_draw(probs: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """[C, V] probabilities -> [C] int64: each row's Gumbel-max with its noise at its position."""
    return gumbel_sample(probs, row_keys(md, probs.device))


def sample_by_method(probs: torch.Tensor, md: SamplingMetadata, method: str,
                     purpose: Purpose = Purpose.SAMPLE,
                     coupled_draw: GumbelDraw = gumbel_draw) -> torch.Tensor:
    """[B, V] probabilities -> [B] int64 samples under rejection_sample_method `method`: the rows
    gumbel.coupled_rows names draw by `coupled_draw` (Gumbel-max; a draft passes its own, which
    reads the target's noise), the others by `sample_from_probs` with their uniform for
    `purpose`. Each subset runs as a batch of its own; every row's draw is keyed by its own seed
    and position, so the split changes no row's token."""
    coupled = coupled_rows(md, method)
    if not any(coupled):
        return sample_from_probs(probs, md, purpose)
    if all(coupled):
        return coupled_draw(probs, md)
    rows = torch.tensor(coupled, device=probs.device)                        # [B] bool
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    out[rows] = coupled_draw(probs[rows], md.select([i for i, c in enumerate(coupled) if c]))
    out[~rows] = sample_from_probs(probs[~rows], md.select(
        [i for i, c in enumerate(coupled) if not c]), purpose)
    return out


class Sampler:
    """Greedy rows take the argmax of the penalised logits; random rows draw from
    compute_probs as `sample_by_method` does for the engine's rejection_sample_method: with their
    own keyed uniform (greedy rows use no randomness), or, where the method couples them (every
    random row under "gumbel", seeded ones under "auto"), the Gumbel-max of its logs with the
    row's noise at its position (gumbel.py: the token a speculative step would emit there,
    whatever the draft)."""

    def __init__(self, method: str = "standard") -> None:
        self.method = method  # "standard" (synthetic engines too), "gumbel" or "auto"

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata,
                 num_logprobs: int | None = None) -> SamplerOutput:
        raw = logits                                  # [B, V]
        logits = logits.float()
        if not md.no_penalties:
            logits = apply_penalties(logits, md)      # [B, V]
        sampled = greedy_tokens(logits)               # [B] greedy answer for every row
        if not md.all_greedy:
            random_rows = (md.temperature != 0.0).nonzero().flatten()  # [R]
            sub_md = md.select(random_rows.tolist())
            probs = compute_probs(logits[random_rows.to(logits.device)], sub_md,
                                  apply_penalty=False)                   # [R, V]
            drawn = sample_by_method(probs, sub_md, self.method)        # [R]
            sampled[random_rows.to(sampled.device)] = drawn
        out_logprobs = None
        if num_logprobs is not None:
            out_logprobs = compute_logprobs(raw, sampled, num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=out_logprobs)

