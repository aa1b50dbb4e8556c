"""A model config to a loaded model on a device (this rank's shard, inside `building_for`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandem.kernels import cpu as cpu_kernels
from tandem.layers.cpu_matmul_weights import apply_cpu_matmul_mode
from tandem.loader.weights import iter_weights
from tandem.models.registry import build_model


def load_model(mc: Any, device: torch.device) -> nn.Module:
    try:
        weights = (iter_weights(mc.model_dir, mc.gguf_file, mc.hf_config)
                   if mc.load_format != "dummy" else None)
        model = build_model(mc.hf_config, mc.dtype, device, weights)
        if weights is None:
            _random_weights(model, mc.seed)
        cpu_kernels.configure(device)
        apply_cpu_matmul_mode(model, mc.dtype, device)
        return model
    except torch.OutOfMemoryError as e:
        raise ValueError(f"{mc.model} does not fit in {device} memory in {mc.dtype} ({e}). Use a "
                         "smaller model or dtype, or free memory on the device.") from e


@torch.no_grad()
def _random_weights(model: nn.Module, seed: int) -> None:
    """load_format "dummy": weights drawn at random (N(0, 0.02), norms 1, biases 0), for
    benchmarking models by their shape only; the output is noise."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        else:
            gen = generators.setdefault(param.device, torch.Generator(device=param.device)
                                        .manual_seed(seed))
            param.normal_(0.0, 0.02, generator=gen)
