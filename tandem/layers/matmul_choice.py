"""Which CPU matmul kernel a float32 linear layer uses, chosen by measurement on this machine.

oneDNN's `_linear_pointwise` and the default BLAS (`F.linear`) trade places from one CPU to the
next: on one 2-core dev machine oneDNN streamed decode-sized matmuls twice as fast, while on an
AMX Xeon BLAS was 1.8x faster for SmolLM2's layers at one token (see docs/performance.md). So
the first time a (weight shape, batch-size bucket) is seen, both are timed on that weight and the
faster is kept for the process. `TANDEM_CPU_MATMUL=blas|onednn` fixes the choice instead.

Decode and verify batches (up to C_MAX_ROWS rows) may instead run our own kernel
(kernels/cpu_gemm.c), timed against the faster torch kernel at 1 and 16 rows the first time a
weight shape is seen (a fused decoder stack's shapes together, in total: `choose_c_together`):
where it wins, it multiplies every batch of that weight up to C_MAX_ROWS
rows, so a token's row gets the same bits in plain decoding and in any verification (the kernel
computes each row alone, in a fixed order). On the AMX Xeon it beat MKL 1.1x at one row and
1.5-1.8x at 4-16 rows, and lost at 256 (docs/performance.md). `TANDEM_CPU_MATMUL=c` uses it for
every shape it takes, BLAS beyond C_MAX_ROWS rows.

Every timing evicts the weight from the caches first (where the kernel library is loaded): a
model larger than the caches streams each weight from memory every step, and that is the race
that matters. Timed hot, a layer's weight sits in L2, where BLAS's kernels are built to win: with
AVX2 only, hot timings picked BLAS for SmolLM2's layers though our kernel ran a single stream
1.4x faster in the engine (docs/performance.md).

`TANDEM_CPU_MATMUL=bf16` is the one mode that changes numerics, so it is never chosen by itself:
on a CPU with native bfloat16 (AVX512-BF16 or AMX) the linear layers' weights are stored in
bfloat16 and multiply bfloat16-rounded activations with float32 accumulation (the products come
back rounded to bfloat16: torch's CPU bf16 matmul has no float32 output; the LM head is one of
them, so logits carry that rounding). The embeddings, the residual stream, norms, attention and
the KV cache stay float32. It halves the bytes a step streams and runs batched steps on AMX
(2-3x faster linear layers at 16 rows on an AMX Xeon, no faster at one row; see
docs/performance.md). Rows are multiplied in fixed chunks of 16, so a row's result never depends
on the batch it is in, and speculative and plain decoding stay identical.
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
C_MAX_ROWS = 64  # the C kernel beat MKL up to 64 rows on the AMX Xeon and lost at 256
_chosen: dict[tuple[int, int, int], Kernel] = {}
_c_chosen: dict[tuple[int, int], bool] = {}  # (out, in) -> the C kernel runs its small batches
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


def _c_wins(weights: list[tuple[torch.Tensor, Optional[torch.Tensor]]]) -> bool:
    """The C kernel is faster than the better torch kernel for each weight, summed over the
    weights (weight, bias) at 1 and 16 rows."""
    c = best_torch = 0.0
    for w, b in weights:
        probes = [torch.randn(rows, w.shape[1]) for rows in (1, 16)]
        c += sum(_time(_c, p, w, b) for p in probes)
        best_torch += min(sum(_time(k, p, w, b) for p in probes) for k in KERNELS.values())
    return c < best_torch


def choose_c_together(weights: list[torch.Tensor]) -> None:
    """Decides the C kernel for these weights' shapes as one (those not decided yet): a fused
    decoder stack (models/llama_fused.py) runs only where it multiplies every one of them, so a
    shape it loses by a few percent alone must not turn off a stack that wins as a whole."""
    if _mode() != "auto" or not cpu_kernels.enabled():
        return
    todo = {(w.shape[0], w.shape[1]): w for w in weights
            if w.shape[1] % 16 == 0 and (w.shape[0], w.shape[1]) not in _c_chosen}
    if todo:
        wins = _c_wins([(w, None) for w in todo.values()])
        _c_chosen.update({shape: wins for shape in todo})


def kernel_for(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Kernel:
    """The kernel for a [rows, in] float32 CPU input against `weight` [out, in]."""
    forced = _mode()
    if forced in KERNELS:
        return KERNELS[forced]
    if x.shape[0] <= C_MAX_ROWS and weight.shape[1] % 16 == 0 and cpu_kernels.enabled():
        if forced == "c":
            return _c
        shape = (weight.shape[0], weight.shape[1])
        use_c = _c_chosen.get(shape)
        if use_c is None:
            use_c = _c_chosen[shape] = _c_wins([(weight, bias)])
        if use_c:
            return _c
    if forced == "c":
        return _blas
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


def chosen_kernels() -> dict[str, str]:
    """The kernel chosen per "out x in, rows" key, for logs and benchmarks."""
    names = {k: n for n, k in KERNELS.items()}
    chosen = {f"{o}x{i}, rows <= {C_MAX_ROWS}": "c" for (o, i), c in _c_chosen.items() if c}
    chosen.update({f"{o}x{i}, rows bucket {r}": names[k] for (o, i, r), k in _chosen.items()})
    return chosen
