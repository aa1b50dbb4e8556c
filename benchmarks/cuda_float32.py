"""pytest plugin for a CUDA run (benchmarks/cuda_suite.sh): dtype "auto" means float32, as on the
CPU, so the suite's float32 references (transformers on the CPU, exact distributions) compare
like with like. On CUDA "auto" is bfloat16 for a float32 checkpoint, as vLLM does, and its
rounding alone moves greedy tokens and fails chi-square tests with tens of thousands of samples."""

from __future__ import annotations

from typing import Any, Union

import torch

import tandem.model_config as mc

_resolve = mc.resolve_dtype


def _float32_for_auto(dtype: Union[str, torch.dtype], hf_config: Any,
                      device: torch.device) -> torch.dtype:
    return torch.float32 if dtype == "auto" else _resolve(dtype, hf_config, device)


mc.resolve_dtype = _float32_for_auto
