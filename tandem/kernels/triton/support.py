"""What every Triton kernel module shares: triton imported only where it is installed, the
interpreter switch, and the checks a wrapper makes before a launch.

`import tandem` never imports this module; importing a kernel module without triton installed
still works (its kernels are stubs that raise when launched), so the package and its tests run
on machines without triton, and the CUDA path asks `available()` before choosing these kernels.

Under `TRITON_INTERPRET=1` (read by `triton.jit` when a kernel module is imported, so set it
before that) the kernels run on CPU tensors in numpy: how they are tested on machines without
a GPU. Otherwise they need CUDA tensors.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch

try:  # pragma: no cover - which branch runs depends on the machine
    import triton
    import triton.language as tl
except ImportError:  # triton absent (or a platform without wheels): stubs below
    triton = None
    tl = None


class _Missing:
    """Stands for a kernel where triton is not installed: defining it works, launching raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        raise RuntimeError(f"Triton kernel {self.name} needs triton, which is not installed "
                           f"(pip install triton).")


def jit(fn: Callable) -> Any:
    """`triton.jit` where triton is installed, else a stub that raises when launched."""
    if triton is None:
        return _Missing(fn.__name__)
    return triton.jit(fn)


def interpreting() -> bool:
    """Whether kernels defined now run in Triton's interpreter (on CPU tensors)."""
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; before, the variable alone
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpret_dots_by_rows() -> None:
    """Under Triton's interpreter `tl.dot` is numpy's matmul, so the host's BLAS, and some of its
    kernels (OpenBLAS's Haswell sgemm, on an AMD EPYC) round an output row by its place in the
    block: a query decoded alone (row 0) and the same query inside a verification (row i) then
    differ in their last bits for the BLAS's sake, and a CPU check of the kernels' batch
    invariance fails where the kernel keeps its rule (fixed tiles, fixed order). This makes
    the interpreter multiply each row of a dot alone, so a row's product never depends on the
    rows beside it; compiled kernels are untouched. Idempotent."""
    if triton is None:
        return
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "by_rows", False):
        return
    whole = builder.create_dot
    handle = interpreter.TensorHandle

    def create_dot(self: Any, a: Any, b: Any, d: Any, *precision: Any) -> Any:
        rows = [whole(self, handle(a.data[..., i:i + 1, :], a.dtype.scalar), b,
                      handle(d.data[..., i:i + 1, :], d.dtype.scalar), *precision).data
                for i in range(a.data.shape[-2])]
        return handle(np.concatenate(rows, axis=-2), d.dtype.scalar)

    create_dot.by_rows = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot


def available(device: torch.device | str | None = None) -> bool:
    """Whether these kernels can run on `device` (default: CUDA): triton installed, and the
    device CUDA (or the CPU under the interpreter)."""
    if triton is None:
        return False
    dev = torch.device(device if device is not None else "cuda")
    if dev.type == "cuda":
        return torch.cuda.is_available() and not interpreting()
    return dev.type == "cpu" and interpreting()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def is_interpreted(kernel: Any) -> bool:
    """Whether `kernel` was defined under the interpreter (decided when its module ran)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_tensors(kernel: Any, **tensors: torch.Tensor) -> None:
    """All on one device that `kernel` runs on (CUDA; the CPU for an interpreted kernel), each
    with its last dimension contiguous (the kernels read rows as vectors)."""
    if triton is None or isinstance(kernel, _Missing):
        raise RuntimeError("Triton kernels need triton, which is not installed (pip install "
                           "triton).")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"Triton kernel arguments on several devices: "
                         f"{ {k: str(t.device) for k, t in tensors.items()} }")
    dev = devices.pop()
    if dev.type == "cpu" and not is_interpreted(kernel):
        raise ValueError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 (set before the "
                         "kernel modules are imported).")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Triton kernels run on CUDA tensors, not {dev.type}.")
    for name, t in tensors.items():
        if t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}: the last dimension must be contiguous, strides "
                             f"{tuple(t.stride())}.")
