"""RMSNorm, with Gemma's (1 + weight) variant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        # Gemma stores w and scales by (1 + w); Llama/Qwen store the scale itself.
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        if x.dtype == torch.float32:
            # One fused op instead of five; identical math in float32.
            w = 1.0 + self.weight if self.unit_offset else self.weight
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(dtype)
        return self.weight * xf.to(dtype)
