"""Tensor-parallel groups, as the layers see them.

A layer captures the group it is built for (`building_for(group)` around model construction) and
uses it for its shard sizes and collectives; model files never mention ranks. The default group
is a single rank, whose collectives are no-ops, so a model built outside any `building_for` is
an ordinary single-process model (the draft beside rank 0 is built that way).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Optional[Any] = None  # a torch.distributed ProcessGroup (None: the default one)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place, each element in rank order. Two ranks' sum is a + b in any
        algorithm; with more, a ring all-reduce starts each chunk's sum at another rank, and the
        chunks follow the tensor's size, so a row's bits would follow its batch: there the
        parts are gathered and added in rank order instead."""
        if self.size == 2:
            dist.all_reduce(x, group=self.group)
        elif self.size > 2:
            x = x.contiguous()
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x, group=self.group)
            x.copy_(parts[0])
            for part in parts[1:]:
                x += part
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `x`, concatenated along `dim` in rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)


SINGLE = TPGroup()
_BUILDING: ContextVar[TPGroup] = ContextVar("tandem_tp_group", default=SINGLE)


@contextmanager
def building_for(group: TPGroup) -> Iterator[None]:
    """Layers constructed inside take `group` as their tensor-parallel group."""
    token = _BUILDING.set(group)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def current_group() -> TPGroup:
    return _BUILDING.get()
