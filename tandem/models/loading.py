"""A model config to a loaded model on a device (this rank's shard, inside `building_for`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandem.loader.weights import iter_weights
from tandem.models.registry import build_model


def load_model(mc: Any, device: torch.device) -> nn.Module:
    try:
        return build_model(mc.hf_config, mc.dtype, device,
                           iter_weights(mc.model_dir, mc.gguf_file, mc.hf_config))
    except torch.OutOfMemoryError as e:
        raise ValueError(f"{mc.model} does not fit in {device} memory in {mc.dtype} ({e}). Use a "
                         "smaller model or dtype, or free memory on the device.") from e
