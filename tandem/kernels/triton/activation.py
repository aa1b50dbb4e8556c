"""Gated MLP activations in one Triton kernel: act(gate) * up on the fused gate/up projection.

x [T, 2I] holds the gate in its first I columns and up in the last I (the order of
`layers/activation.py`, whose `x.chunk(2, dim=-1)` gives (gate, up)); out [T, I].
SiLU: g * sigmoid(g). GELU(tanh): 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3),
computed as g * sigmoid(2u), the same value without tanh's cancellation near -1 (as the CPU
kernel does); the sigmoid from exp(-|x|), which cannot overflow.

The activation is computed in float32 and rounded to the dtype before the product, then the
product is rounded once: torch's `F.silu(gate) * up` in 16-bit dtypes rounds at the same two
places. Elementwise, one row and 1024 columns a program, so no result depends on the batch.
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels.triton.support import cdiv, check_tensors, jit, tl

BLOCK = 1024  # columns per program


@jit
def _sigmoid(x):
    """1 / (1 + exp(-x)) from exp(-|x|), which never overflows."""
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@jit
def _act_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_o,
                        BLOCK: tl.constexpr, GELU: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    g = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + inter + cols, mask=ok, other=0.0).to(tl.float32)
    if GELU:  # 0.5 g (1 + tanh(z)) = g * sigmoid(2z)
        a = g * _sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g))
    else:
        a = g * _sigmoid(g)
    a = a.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (a * u).to(out_ptr.dtype.element_ty), mask=ok)


def _act_and_mul(x: torch.Tensor, gelu: bool, out: Optional[torch.Tensor]) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"x {tuple(x.shape)}: need [T, 2I]")
    t, inter = x.shape[0], x.shape[1] // 2  # x: [T, 2I] -> out: [T, I]
    out = x.new_empty(t, inter) if out is None else out
    check_tensors(_act_and_mul_kernel, x=x, out=out)
    if t and inter:
        _act_and_mul_kernel[(t, cdiv(inter, BLOCK))](
            x, out, inter, x.stride(0), out.stride(0), BLOCK=BLOCK, GELU=gelu, num_warps=4,
            enable_fp_fusion=True)
    return out


def silu_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [T, 2I] (gate, up) -> silu(gate) * up [T, I]."""
    return _act_and_mul(x, False, out)


def gelu_tanh_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [T, 2I] (gate, up) -> gelu_tanh(gate) * up [T, I]."""
    return _act_and_mul(x, True, out)
