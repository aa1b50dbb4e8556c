"""Sampling: per-batch metadata, logits processing, the token sampler, the speculative-decoding
rejection sampler, logprobs, and structured outputs.

The names below load on first use, so that importing `tandem.sample.structured_params` (which
`SamplingParams` does) does not import torch: `tandem serve --help` and argument errors answer at
once.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "apply_penalties": "logits_processing", "compute_probs": "logits_processing",
    "filter_probs": "logits_processing", "LogprobsTensors": "logprobs",
    "compute_logprobs": "logprobs", "SamplingMetadata": "metadata",
    "RejectionOutput": "rejection_sampler", "RejectionSampler": "rejection_sampler",
    "Sampler": "sampler", "SamplerOutput": "sampler", "sample_from_probs": "sampler",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tandem.sample.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tandem.sample' has no attribute {name!r}")
