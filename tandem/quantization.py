"""The `quantization` engine argument (vLLM's name): which weights stay quantized, checked once.

Values: "gguf" (a GGUF file's blocks kept as they are; the default for a GGUF file), "none"
(dequantize to `dtype` at load), "q8_0", "q4_0", "q4_k" (a float checkpoint, or random weights
with load_format="dummy", quantized tensor by tensor at load). Quantized weights run on our CPU
kernels with float32 activations at tensor_parallel_size 1. Where "gguf" cannot run so (CUDA,
another dtype, several ranks), the file is dequantized, as before, with a log line; the
quantize-at-load values are refused there with the reason.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

QUANTIZATION_VALUES = ("gguf", "none", "q8_0", "q4_0", "q4_k")
logger = logging.getLogger("tandem")


def resolve_quantization(requested: Optional[str], gguf_file: Optional[str], dtype: torch.dtype,
                         device: torch.device, tp: int, field: str = "quantization"
                         ) -> Optional[str]:
    """The mode the weights load in: None (float) or one of "gguf", "q8_0", "q4_0", "q4_k"."""
    if requested is not None and requested not in QUANTIZATION_VALUES:
        raise ValueError(f"{field}={requested!r} is not supported; choose one of "
                         f"{list(QUANTIZATION_VALUES)} (or leave it unset: a GGUF file then "
                         "keeps its quantized weights).")
    if requested == "none":
        return None
    why_not = _why_not_native(dtype, device, tp)
    if requested in (None, "gguf"):
        if gguf_file is None:
            if requested == "gguf":
                raise ValueError(f"{field}='gguf' needs a GGUF file, but the model is not one.")
            return None
        if why_not:
            logger.info("%s: the GGUF weights are dequantized to %s at load (%s)",
                        gguf_file, dtype, why_not)
            return None
        return "gguf"
    if why_not:
        raise ValueError(f"{field}={requested!r} runs on the CPU in float32 at "
                         f"tensor_parallel_size 1 only ({why_not}); use {field}='none' or "
                         "device='cpu', dtype='float32'.")
    return requested


def _why_not_native(dtype: torch.dtype, device: torch.device, tp: int) -> str:
    if device.type != "cpu":
        return f"quantized kernels are CPU kernels, the device is {device}"
    if dtype != torch.float32:
        return f"quantized kernels take float32 activations, dtype is {dtype}"
    if tp > 1:
        return f"tensor_parallel_size={tp} would split quantized blocks"
    return ""

