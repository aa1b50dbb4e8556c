"""A model config to a loaded model on a device (this rank's shard, inside `building_for`)."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from torch import nn

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import triton_route
from tandem.layers.cpu_matmul_weights import apply_cpu_matmul_mode
from tandem.layers.quantized import finish_quantized, quantized_build
from tandem.loader.weights import iter_weights
from tandem.models.registry import build_model

logger = logging.getLogger("tandem")


def load_model(mc: Any, device: torch.device) -> nn.Module:
    try:
        cpu_kernels.configure(device)  # first: quantized weights need the kernels at load
        triton_route.configure(device)  # CUDA: the Triton kernels where triton runs
        mode = _quantization(mc)
        weights = (iter_weights(mc.model_dir, mc.gguf_file, mc.hf_config,
                                keep_quantized=mode == "gguf")
                   if mc.load_format != "dummy" else None)
        with quantized_build(mode):
            model = build_model(mc.hf_config, mc.dtype, device, weights, mc.max_model_len)
        if weights is None:
            _random_weights(model, mc.seed)
        finish_quantized(model)
        apply_cpu_matmul_mode(model, mc.dtype, device)
        return model
    except torch.OutOfMemoryError as e:
        raise ValueError(f"{mc.model} does not fit in {device} memory in {mc.dtype} ({e}). Use a "
                         "smaller model or dtype, or free memory on the device.") from e


def _quantization(mc: Any) -> Optional[str]:
    """The config's quantization, where the kernels that run it were built."""
    mode = getattr(mc, "quantization", None)
    if mode is None or cpu_kernels.enabled():
        return mode
    if mode == "gguf":
        logger.info("%s: the GGUF weights are dequantized to float32 at load (the CPU kernels "
                    "are off or could not be built: see above)", mc.model)
        return None
    raise ValueError(f"quantization={mode!r} needs the CPU kernels, which are off "
                     "(TANDEM_CPU_KERNELS='torch', or they could not be built: see the log); "
                     "use quantization='none'.")


_ROWS_PER_DRAW = 1 << 14  # a quantized layer's random rows are drawn and quantized this many at a time


@torch.no_grad()
def _random_weights(model: nn.Module, seed: int) -> None:
    """load_format "dummy": weights drawn at random (N(0, 0.02), norms 1, biases 0), for
    benchmarking models by their shape only; the output is noise. A quantized layer's rows are
    drawn a slice at a time and quantized, so no float copy of the model ever exists."""
    generators: dict[torch.device, torch.Generator] = {}

    def gen(device: torch.device) -> torch.Generator:
        return generators.setdefault(device, torch.Generator(device=device).manual_seed(seed))

    for name, param in model.named_parameters():
        if param.is_meta:
            continue  # a quantized layer's weight: filled below
        if name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen(param.device))
    for module in model.modules():
        parts = getattr(module, "quant_parts", None)
        if parts is None:
            continue
        rows, cols = parts.shape
        for start in range(0, rows, _ROWS_PER_DRAW):
            n = min(_ROWS_PER_DRAW, rows - start)
            draw = torch.empty(n, cols).normal_(0.0, 0.02, generator=gen(torch.device("cpu")))
            parts.add(start, draw)
