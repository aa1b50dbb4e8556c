"""Tensor-parallel process-group state. At tensor_parallel_size 1 (the only size this build runs)
every collective is a no-op; the linear layers already shard through these calls, so a multi-process
executor only has to initialise torch.distributed."""

from __future__ import annotations

import torch
import torch.distributed as dist


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if tp_size() > 1:
        dist.all_reduce(x)
    return x
