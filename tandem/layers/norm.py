"""RMSNorm, with Gemma's (1 + weight) variant: the Triton kernel on the CUDA path
(kernels/triton_route.py), the fused CPU kernel in float32 on the CPU, else torch ops."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import triton_route


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        # Gemma stores w and scales by (1 + w); Llama/Qwen store the scale itself.
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        triton = triton_route.kernels_for(x)
        if triton is not None and x.dim() == 2 and x.stride(-1) == 1:
            return triton.norm.rms_norm(x, self.weight, self.eps, self.unit_offset)
        if x.dtype == torch.float32:
            fused = cpu_kernels.rms_norm(x, self.weight, self.eps, self.unit_offset)
            if fused is not None:
                return fused
            # One fused op instead of five; identical math in float32.
            w = 1.0 + self.weight if self.unit_offset else self.weight
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(dtype)
        return self.weight * xf.to(dtype)

    def add(self, x: torch.Tensor,
            residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream's add fused with this norm: (norm(residual + x), residual + x),
        with residual None meaning x starts the stream. On the CPU in float32 one kernel does
        both, writing the sum into `residual` in place (the Triton kernel too, and with residual
        None it hands x itself on as the stream, which the next add then writes)."""
        triton = triton_route.kernels_for(x)
        if triton is not None and x.dim() == 2 and x.stride(-1) == 1 and (
                residual is None or residual.stride(-1) == 1):
            return triton.norm.add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)
        fused = cpu_kernels.add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)
        if fused is not None:
            return fused
        residual = x if residual is None else residual + x
        return self(residual), residual
