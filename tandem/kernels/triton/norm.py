"""Fused residual add + RMSNorm in one Triton kernel, with Gemma's (1 + w) variant.

Computes, per row of x [T, N] (a model's hidden states), what `layers/norm.RMSNorm.add` does:
the new residual r = residual + x (or x itself when residual is None: x starts the stream),
then normed = r * rsqrt(mean(r^2) + eps) * w (Llama, Qwen) or * (1 + w) (Gemma), and returns
(normed, r), so a layer hands (output, residual stream) on and the next norm takes the add.

Order, as the torch path in 16-bit dtypes: r is rounded to the dtype first (that is the stream
the next layer adds to), the mean of squares is taken in float32 over the rounded r, and for
Llama's weight the normalised value is rounded to the dtype before it is multiplied by w (torch
computes `w * x_normed.to(dtype)`), for Gemma's (1 + w) in float32 and rounded once. One program
takes one whole row (N up to a few ten thousands) and sums it in one fixed tree, so a row's
result never depends on the batch.
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels.triton.support import check_tensors, jit, next_pow2, tl


@jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n, eps,
                         stride_x, stride_r, stride_o, stride_ro,
                         BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                         UNIT_OFFSET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=ok, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        y = xf * rstd * (1.0 + w)
    else:
        y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float, unit_offset: bool = False, out: Optional[torch.Tensor] = None,
                 residual_out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, N], residual [T, N] or None, weight [N] -> (normed [T, N], new residual [T, N]).

    With residual None the new residual is x itself (nothing is copied). The sum goes to
    residual_out (default: `residual`, in place, as the CPU kernel does; pass a fresh tensor to
    keep it)."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [T, N], [N]")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    t, n = x.shape  # x, residual, out: [T, N]; weight: [N]
    out = torch.empty_like(x) if out is None else out
    if residual is None:
        res, res_out = x, x
    else:
        res = residual
        res_out = residual if residual_out is None else residual_out
    check_tensors(_add_rms_norm_kernel, x=x, residual=res, weight=weight, out=out,
                  residual_out=res_out)
    if t:
        block = next_pow2(n)
        _add_rms_norm_kernel[(t,)](
            x, res, weight, out, res_out, n, float(eps),
            x.stride(0), res.stride(0), out.stride(0), res_out.stride(0),
            BLOCK=block, HAS_RESIDUAL=residual is not None, UNIT_OFFSET=bool(unit_offset),
            num_warps=min(16, max(1, block // 256)), enable_fp_fusion=True)
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             unit_offset: bool = False) -> torch.Tensor:
    """x [T, N] -> x * rsqrt(mean(x^2) + eps) * w (or * (1 + w)): the norm without the add."""
    return add_rms_norm(x, None, weight, eps, unit_offset)[0]
