"""Which CPU kernel multiplies a float32 linear layer, and the bfloat16 weight mode.

By default (`TANDEM_CPU_MATMUL=auto`) every float32 linear layer runs our own kernel
(kernels/cpu_gemm.c) at every number of rows: decode, verification and prefill. It computes each
output as one dot product in a fixed order, so a row's bits never depend on its batch, its place
in it, the thread count or the number of rows: plain decoding, speculative verification, any
chunking of a prompt and a preemption's recompute multiply a token's row the same way, and
greedy speculation stays lossless at every batch size and every k (`c` is the same, and refuses
to load without the kernel library). BLAS and oneDNN pick their kernels, and so their rounding,
by the shape, so a row's last bits would follow its batch.

`TANDEM_CPU_MATMUL=blas` or `onednn` runs that torch kernel instead, at every size: an explicit
choice, off by default, that gives up batch invariance for BLAS's speed on large batches (see
docs/performance.md for what it gives on prefill). Without the kernel library (no C compiler,
`TANDEM_CPU_KERNELS=torch`), the faster of the two is timed per shape and row bucket at its first
use.

`TANDEM_CPU_MATMUL=bf16` is the one mode that changes numerics, so it is never chosen by itself:
on a CPU with native bfloat16 (AVX512-BF16 or AMX) the linear layers' weights are stored in
bfloat16 and multiply bfloat16-rounded activations with float32 accumulation (the products come
back rounded to bfloat16: torch's CPU bf16 matmul has no float32 output; the LM head is one of
them, so logits carry that rounding). The embeddings, the residual stream, norms, attention and
the KV cache stay float32. It halves the bytes a step streams and runs batched steps on AMX
where the CPU grants it. Rows are multiplied in fixed chunks of 16, so a row's result never
depends on the batch it is in, and speculative and plain decoding stay identical.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels.cpu_build import cpu_flags

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


def _c(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    y = cpu_kernels.linear(x.contiguous(), w, b)
    return F.linear(x, w, b) if y is None else y  # a weight layout the kernel does not take


KERNELS: dict[str, Kernel] = {"blas": _blas, **({"onednn": _onednn} if _has_onednn() else {})}
MODES = ("auto", "blas", "onednn", "c", "bf16")
_chosen: dict[tuple[int, int, int], Kernel] = {}  # without the kernels: (out, in, bucket)
_forced: list[str] = []  # the validated TANDEM_CPU_MATMUL of the last model load


def cpu_matmul_mode() -> str:
    """TANDEM_CPU_MATMUL, validated: a value outside MODES is an error, never ignored."""
    mode = os.environ.get("TANDEM_CPU_MATMUL", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"TANDEM_CPU_MATMUL={mode!r} is not supported; choose one of "
                         f"{list(MODES)}.")
    if mode == "onednn" and "onednn" not in KERNELS:
        raise ValueError("TANDEM_CPU_MATMUL='onednn' needs a torch build with oneDNN; this one "
                         "has none (use 'auto' or 'blas').")
    _forced[:] = [mode]
    return mode


def _mode() -> str:
    """The mode of the last model load ("auto" before any)."""
    return _forced[0] if _forced else "auto"


def native_bf16() -> bool:
    """The CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


# bf16 matmuls run in chunks of exactly this many rows (the last one zero-padded): oneDNN picks
# its kernel, and so its rounding, by the row count (for SmolLM2's LM head the result of a row
# changed at 64 rows), and the products are rounded to bf16, so without a fixed shape a token's
# numbers would depend on how many others share its step. With it, plain decoding, speculative
# verification and any batch give every row the same bits, and greedy speculation stays lossless.
BF16_ROWS = 16


def bf16_linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x [T, in] float32 @ w [out, in] bfloat16 -> [T, out] float32 (accumulated in float32,
    rounded to bfloat16 on the way out), the same for a row whatever T is."""
    t = x.shape[0]
    xb = x.to(torch.bfloat16)
    pad = -t % BF16_ROWS
    if pad:
        xb = torch.cat((xb, xb.new_zeros(pad, xb.shape[1])))
    chunks = xb.split(BF16_ROWS)
    y = F.linear(chunks[0], w) if len(chunks) == 1 else torch.cat([F.linear(c, w) for c in chunks])
    y = y[:t].float()  # [T, out]
    return y if b is None else y + b


def _bucket(rows: int) -> int:
    return next((b for b in _BUCKETS if rows <= b), _BUCKETS[-1])


def _time(kernel: Kernel, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> float:
    """The best of a few calls, each with w evicted from the caches first (kept hot where the
    kernel library, which evicts, is off)."""
    kernel(x, w, b)  # warm-up (oneDNN builds its primitive on first use)
    best = float("inf")
    for _ in range(4):
        cpu_kernels.evict(w)
        t0 = time.perf_counter()
        kernel(x, w, b)
        best = min(best, time.perf_counter() - t0)
    return best


def kernel_for(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Kernel:
    """The kernel for a [rows, in] float32 CPU input against `weight` [out, in]."""
    forced = _mode()
    if forced in KERNELS:
        return KERNELS[forced]
    if cpu_kernels.enabled():
        return _c
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
