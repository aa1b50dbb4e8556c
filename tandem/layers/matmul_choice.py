"""Which CPU matmul kernel a float32 linear layer uses, chosen by measurement on this machine.

oneDNN's `_linear_pointwise` and the default BLAS (`F.linear`) trade places from one CPU to the
next: on one 2-core dev machine oneDNN streamed decode-sized matmuls twice as fast, while on an
AMX Xeon BLAS was 1.8x faster for SmolLM2's layers at one token (see docs/performance.md). So
the first time a (weight shape, batch-size bucket) is seen, both are timed on that weight and the
faster is kept for the process. `TANDEM_CPU_MATMUL=blas|onednn` fixes the choice instead.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

Kernel = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
_BUCKETS = (1, 4, 16, 64, 256)  # rows a linear sees: decode, verify, batches, prefill chunks


def _onednn(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def _blas(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(x, w, b)


def _has_onednn() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                 "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


KERNELS: dict[str, Kernel] = {"blas": _blas, **({"onednn": _onednn} if _has_onednn() else {})}
_chosen: dict[tuple[int, int, int], Kernel] = {}


def _bucket(rows: int) -> int:
    return next((b for b in _BUCKETS if rows <= b), _BUCKETS[-1])


def _time(kernel: Kernel, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> float:
    kernel(x, w, b)  # warm-up (oneDNN builds its primitive on first use)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        kernel(x, w, b)
        kernel(x, w, b)
        best = min(best, time.perf_counter() - t0)
    return best


def kernel_for(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Kernel:
    """The kernel for a [rows, in] float32 CPU input against `weight` [out, in]."""
    forced = os.environ.get("TANDEM_CPU_MATMUL", "auto")
    if forced in KERNELS:
        return KERNELS[forced]
    rows = _bucket(x.shape[0])
    key = (weight.shape[0], weight.shape[1], rows)
    kernel = _chosen.get(key)
    if kernel is None:
        if len(KERNELS) == 1:
            kernel = _blas
        else:
            probe = torch.randn(rows, weight.shape[1], dtype=x.dtype)
            kernel = min(KERNELS.values(), key=lambda k: _time(k, probe, weight, bias))
        _chosen[key] = kernel
    return kernel


def chosen_kernels() -> dict[tuple[int, int, int], str]:
    """(out, in, rows bucket) -> kernel name, for logs and benchmarks."""
    names = {k: n for n, k in KERNELS.items()}
    return {key: names[k] for key, k in _chosen.items()}
