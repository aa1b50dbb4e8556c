"""Load checkpoint tensors (HF names) into our modules, routing fused projections to their shards."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from tandem.layers.quantized import RawQuant

# checkpoint name fragment -> (our fused parameter fragment, shard id)
STACKED = (
    ("q_proj", "qkv_proj", "q"), ("k_proj", "qkv_proj", "k"), ("v_proj", "qkv_proj", "v"),
    ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1),
)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    tied = getattr(model.config, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for name, tensor in weights:
        if "rotary_emb" in name or (tied and name == "lm_head.weight"):
            continue
        shard = None
        for ckpt, fused, shard_id in STACKED:
            if f".{ckpt}." in name:
                name, shard = name.replace(ckpt, fused), shard_id
                break
        if name not in params:
            raise ValueError(f"Checkpoint tensor {name!r} has no matching parameter in "
                             f"{type(model).__name__}.")
        param = params[name]
        quant_loader = getattr(param, "quant_loader", None)
        if quant_loader is not None:  # a layer that keeps its weight quantized
            quant_loader(tensor, shard)
            loaded.add(name)
            continue
        if isinstance(tensor, RawQuant):  # file blocks (2-D only) for a layer that holds float32
            tensor = tensor.dequantize()
        tensor = tensor.to(param.dtype)
        loader = getattr(param, "weight_loader", None)
        if loader is not None:
            loader(param, tensor, shard)
        else:
            if param.shape != tensor.shape:
                raise ValueError(f"Shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                                 f"model {tuple(param.shape)}.")
            param.data.copy_(tensor)
        loaded.add(name)
    missing = sorted(n for n in params if n not in loaded)
    if missing:
        raise ValueError(f"Checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:5]}.")
