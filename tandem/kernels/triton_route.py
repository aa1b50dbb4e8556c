"""Which tensors the Triton kernels (`kernels/triton/`) serve: the switch the layers ask.

On CUDA the layers run the Triton kernels (fused add + RMSNorm, q/k norm + rope + KV write,
unified paged attention over the block table, SiLU/GELU-and-mul) where triton runs, chosen once
at model load (`configure`, from `TANDEM_CUDA_KERNELS`, read then and never at import). On the
CPU nothing changes: the route is off and `kernels_for` costs the layers one load and compare
before their C kernels.

For tests, `routing(kernels)` turns the route on for CPU float32 tensors too, with kernel modules
the caller imported under Triton's interpreter (tests/kernels_triton/conftest.py), so an engine
on a tiny model runs its steps through the Triton path on the CPU and can be compared with the
CPU path. This module never imports triton itself: `configure` does, on CUDA only.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import types
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

logger = logging.getLogger("tandem")

MODES = ("auto", "triton", "torch")
MODULES = ("norm", "activation", "rope_kv", "paged_attention")


@dataclass(frozen=True)
class Route:
    kernels: Any  # the kernel modules: .norm, .activation, .rope_kv, .paged_attention
    cpu: bool     # CPU float32 tensors too (kernels run by the interpreter: tests)


_route: list[Optional[Route]] = [None]  # the process's route (one engine's models share it)


def kernels_for(x: torch.Tensor) -> Optional[Any]:
    """The Triton kernel modules for a layer's input x, or None: its usual path."""
    route = _route[0]
    if route is None:
        return None
    if x.is_cuda or (route.cpu and x.dtype is torch.float32 and x.device.type == "cpu"):
        return route.kernels
    return None


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` runs through the Triton kernels (and so takes the
    Triton attention metadata of worker/graph_inputs.py)."""
    route = _route[0]
    if route is None:
        return False
    return device.type == "cuda" or (route.cpu and device.type == "cpu"
                                     and dtype == torch.float32)


def cuda_kernels_mode() -> str:
    mode = os.environ.get("TANDEM_CUDA_KERNELS", "auto")
    if mode not in MODES:
        raise ValueError(f"TANDEM_CUDA_KERNELS must be one of {list(MODES)}, got {mode!r}.")
    return mode


def configure(device: torch.device) -> None:
    """At model load on `device`: on CUDA, the Triton kernels unless TANDEM_CUDA_KERNELS=torch
    (auto: where triton is installed, else torch's ops (SDPA), logged; triton: required)."""
    if device.type != "cuda":
        return
    mode = cuda_kernels_mode()
    if mode == "torch":
        _route[0] = None
        logger.info("CUDA kernels: torch ops (SDPA attention), TANDEM_CUDA_KERNELS=torch")
        return
    if _route[0] is not None and not _route[0].cpu:
        return  # the draft's load after the target's
    from tandem.kernels import triton as triton_kernels  # imports triton, where installed
    if not triton_kernels.available(device):
        if mode == "triton":
            raise ValueError("TANDEM_CUDA_KERNELS='triton' needs triton with a CUDA device (and "
                             "TRITON_INTERPRET unset); use 'auto' or 'torch'.")
        logger.warning("CUDA kernels: torch ops (SDPA attention, no CUDA graphs): triton is not "
                       "installed (pip install triton)")
        return
    mods = {name: importlib.import_module(f"tandem.kernels.triton.{name}") for name in MODULES}
    _route[0] = Route(types.SimpleNamespace(**mods), cpu=False)
    logger.info("CUDA kernels: Triton (paged attention, add+RMSNorm, rope+KV write, "
                "act-and-mul), TANDEM_CUDA_KERNELS=%s", mode)


@contextlib.contextmanager
def routing(kernels: Any, cpu: bool = True) -> Iterator[None]:
    """The route through `kernels` (modules as `configure` imports them) while the block lasts,
    CPU float32 tensors included where `cpu`; the previous route comes back on exit."""
    before = _route[0]
    _route[0] = Route(kernels, cpu)
    try:
        yield
    finally:
        _route[0] = before
