"""Gated MLP activations: act(gate) * up on a fused [.., 2 * inter] input (the Triton kernel on
the CUDA path, the fused CPU kernel in float32 on the CPU, else torch ops)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import triton_route


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    triton = triton_route.kernels_for(x)
    if triton is not None and x.dim() == 2:
        return triton.activation.silu_and_mul(x)
    fused = cpu_kernels.silu_and_mul(x)  # one pass on the CPU in float32
    if fused is not None:
        return fused
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    triton = triton_route.kernels_for(x)
    if triton is not None and x.dim() == 2:
        return triton.activation.gelu_tanh_and_mul(x)
    fused = cpu_kernels.gelu_tanh_and_mul(x)  # one pass on the CPU in float32
    if fused is not None:
        return fused
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS = {"silu": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul,
               "gelu_tanh": gelu_tanh_and_mul}


def get_act_and_mul(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"Unsupported hidden_act {name!r}; supported: {list(ACTIVATIONS)}.")
    return ACTIVATIONS[name]
