"""Sampling: per-batch metadata, logits processing, the token sampler, the speculative-decoding
rejection sampler and logprobs."""

from __future__ import annotations

from tandem.sample.logits_processing import apply_penalties, compute_probs, filter_probs
from tandem.sample.logprobs import LogprobsTensors, compute_logprobs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rejection_sampler import RejectionOutput, RejectionSampler
from tandem.sample.sampler import Sampler, SamplerOutput, sample_from_probs

__all__ = [
    "LogprobsTensors", "RejectionOutput", "RejectionSampler", "Sampler", "SamplerOutput",
    "SamplingMetadata", "apply_penalties", "compute_logprobs", "compute_probs", "filter_probs",
    "sample_from_probs",
]
