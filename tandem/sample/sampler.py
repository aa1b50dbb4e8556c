"""Sampler: one token per row from target logits (plain decoding, and the rejection sampler's and
the draft proposer's building block `sample_from_probs`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.sample.logits_processing import apply_penalties, compute_probs
from tandem.sample.logprobs import LogprobsTensors, compute_logprobs
from tandem.sample.metadata import SamplingMetadata


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None


def draw_exponential(generators: list[torch.Generator], vocab_size: int,
                     device: torch.device) -> torch.Tensor:
    """[B, V] float32 Exp(1) noise, row i drawn from generators[i] only (exactly V draws each)."""
    noise = torch.empty(len(generators), vocab_size, dtype=torch.float32, device=device)
    for i, g in enumerate(generators):
        noise[i].exponential_(generator=g)
    # Exp(1) can round to 0 in float32; keep the division finite (changes nothing measurable).
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax(w / E) with E ~ Exp(1) is distributed as normalize(w).
    weights: [B, V] non-negative (need not sum to 1); noise: [B, V]. Returns [B] int64."""
    return (weights / noise).argmax(dim=-1)


def sample_from_probs(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """[B, V] probabilities -> [B] int64 samples, row i drawn with generators[i]."""
    if probs.shape[0] != len(generators):
        raise ValueError(f"need one generator per row: {probs.shape[0]} rows, "
                         f"{len(generators)} generators.")
    if probs.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=probs.device)
    return race(probs, draw_exponential(generators, probs.shape[-1], probs.device))


class Sampler:
    """Greedy rows take the argmax of the penalised logits; random rows draw from
    compute_probs with their own generator (greedy rows consume no randomness)."""

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata,
                 num_logprobs: int | None = None) -> SamplerOutput:
        raw = logits                                  # [B, V]
        logits = logits.float()
        if not md.no_penalties:
            logits = apply_penalties(logits, md)      # [B, V]
        sampled = logits.argmax(dim=-1)               # [B] greedy answer for every row
        if not md.all_greedy:
            random_rows = (md.temperature != 0.0).nonzero().flatten()  # [R]
            sub_md = md.select(random_rows.tolist())
            probs = compute_probs(logits[random_rows.to(logits.device)], sub_md,
                                  apply_penalty=False)                   # [R, V]
            drawn = sample_from_probs(probs, sub_md.generators)          # [R]
            sampled[random_rows.to(sampled.device)] = drawn
        out_logprobs = None
        if num_logprobs is not None:
            out_logprobs = compute_logprobs(raw, sampled, num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=out_logprobs)

