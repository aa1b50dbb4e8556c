"""q/k norm + rotary + KV-cache write in one Triton kernel, from the fused qkv projection.

qkv [T, (H + 2 Hkv) D] holds each token's H query heads, Hkv key heads and Hkv value heads.
Per token and head: the q and k heads are RMS-normalised over the head (when the model has q/k
norms: Qwen3 with w, Gemma 3 with 1 + w), then rotated by the full-width tables that
`layers/rotary.RotaryEmbedding` builds (cos [T, 1, D] and the signed sin [T, 1, D], -sin on
the first half: out = x * cos + rotate(x) * sin, rotate pairing dimension i with i + D/2, partial
rotary included; a tile holds both halves of its heads side by side, so each lane rotates the
pairs it read); the rotated q heads are written to q_out (by default in place in qkv, as the
CPU kernel does), the rotated k heads and the v heads to the caches [num_slots, Hkv, D] at
slot_mapping[t]. A token with slot -1 (CUDA-graph padding) writes nothing to the caches.

Order, as the torch path: the normalised head is rounded to the dtype before the rotation (torch
rotates the norm's output), and the rotation runs in float32 and is rounded once. A program
takes a few heads of one token (q heads first, then k heads with their v heads); nothing depends
on the batch.
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels.triton.support import cdiv, check_tensors, jit, next_pow2, tl


@jit
def _normed(x, w, rstd, UNIT_OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """The norm of layers/norm.py in 16-bit dtypes (float32: the same math, no rounding)."""
    if UNIT_OFFSET:
        return (x * rstd * (1.0 + w)).to(DTYPE).to(tl.float32)
    return ((x * rstd).to(DTYPE).to(tl.float32) * w).to(DTYPE).to(tl.float32)


@jit
def _rope_write_kv_kernel(
        qkv_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, q_out_ptr,
        q_w_ptr, k_w_ptr, eps,
        stride_t, stride_cos, stride_sin, stride_ks, stride_kh, stride_vs, stride_vh,
        stride_qt, stride_qh,
        H: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_P2: tl.constexpr,
        BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)   # [BLOCK_H] q heads, then k
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF_P2)   # dimension i of the first half, i + HALF of the second
    d_ok = offs < HALF
    is_q = heads < H
    is_k = (heads >= H) & (heads < H + HKV)
    ok = (is_q | is_k)[:, None] & d_ok[None, :]
    row = qkv_ptr + t * stride_t + heads[:, None] * HEAD_DIM + offs[None, :]
    dtype = qkv_ptr.dtype.element_ty
    # Each element is read and written by the same lane (both halves in one tile, the same
    # layout), so q may be rotated in place.
    x1 = tl.load(row, mask=ok, other=0.0).to(tl.float32)          # [BLOCK_H, HALF_P2]
    x2 = tl.load(row + HALF, mask=ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)[:, None]
        w1 = tl.where(is_q[:, None], tl.load(q_w_ptr + offs, mask=d_ok, other=0.0)[None, :],
                      tl.load(k_w_ptr + offs, mask=d_ok, other=0.0)[None, :]).to(tl.float32)
        w2 = tl.where(is_q[:, None],
                      tl.load(q_w_ptr + HALF + offs, mask=d_ok, other=0.0)[None, :],
                      tl.load(k_w_ptr + HALF + offs, mask=d_ok, other=0.0)[None, :]
                      ).to(tl.float32)
        x1 = _normed(x1, w1, rstd, UNIT_OFFSET, dtype)
        x2 = _normed(x2, w2, rstd, UNIT_OFFSET, dtype)
    c1 = tl.load(cos_ptr + t * stride_cos + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_cos + HALF + offs, mask=d_ok,
                 other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_sin + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_sin + HALF + offs, mask=d_ok,
                 other=0.0).to(tl.float32)[None, :]
    y1 = x1 * c1 + x2 * s1   # the signed sin: x1 cos - x2 sin
    y2 = x2 * c2 + x1 * s2   # x2 cos + x1 sin
    qh = tl.where(is_q, heads, 0)
    q_row = q_out_ptr + t * stride_qt + qh[:, None] * stride_qh + offs[None, :]
    q_ok = is_q[:, None] & d_ok[None, :]
    tl.store(q_row, y1.to(q_out_ptr.dtype.element_ty), mask=q_ok)
    tl.store(q_row + HALF, y2.to(q_out_ptr.dtype.element_ty), mask=q_ok)
    slot = tl.load(slot_ptr + t + heads * 0).to(tl.int64)[:, None]   # [BLOCK_H, 1], one value
    kh = tl.where(is_k, heads - H, 0)
    kv_ok = is_k[:, None] & (slot >= 0) & d_ok[None, :]
    k_row = k_cache_ptr + slot * stride_ks + kh[:, None] * stride_kh + offs[None, :]
    tl.store(k_row, y1.to(k_cache_ptr.dtype.element_ty), mask=kv_ok)
    tl.store(k_row + HALF, y2.to(k_cache_ptr.dtype.element_ty), mask=kv_ok)
    v_row = v_cache_ptr + slot * stride_vs + kh[:, None] * stride_vh + offs[None, :]
    v_src = row + HKV * HEAD_DIM   # the v head Hkv heads after its k head
    tl.store(v_row, tl.load(v_src, mask=kv_ok, other=0.0).to(v_cache_ptr.dtype.element_ty),
             mask=kv_ok)
    tl.store(v_row + HALF, tl.load(v_src + HALF, mask=kv_ok,
                                   other=0.0).to(v_cache_ptr.dtype.element_ty), mask=kv_ok)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int, head_dim: int,
                  q_norm_weight: Optional[torch.Tensor] = None,
                  k_norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                  unit_offset: bool = False,
                  q_out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) D]; cos, sin [T, 1, D] or [T, D] (RotaryEmbedding's tables);
    slot_mapping [T] int32/int64 (-1: skip); caches [num_slots, Hkv, D]; q/k norm weights [D]
    (both or neither). Writes k, v to the caches and returns the rotated q [T, H, D] (q_out, by
    default a view of qkv rotated in place)."""
    t = qkv.shape[0]  # qkv: [T, (H + 2 Hkv) D]; q_out: [T, H, D]; caches: [num_slots, Hkv, D]
    h, hkv, d = num_heads, num_kv_heads, head_dim
    if qkv.dim() != 2 or qkv.shape[1] != (h + 2 * hkv) * d or d % 2:
        raise ValueError(f"qkv {tuple(qkv.shape)} is not [T, (H + 2 Hkv) D] for H={h}, "
                         f"Hkv={hkv}, D={d} (D even)")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q and k norm weights go together (both or neither)")
    if qkv.stride(1) != 1:
        raise ValueError("qkv's rows must be contiguous")
    cos2, sin2 = cos.reshape(t, cos.shape[-1]), sin.reshape(t, sin.shape[-1])  # [T, D]
    if cos2.shape[1] != d or sin2.shape[1] != d:
        raise ValueError(f"rope tables {tuple(cos.shape)} are not head_dim {d} wide")
    if k_cache.shape[1:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} are not "
                         f"[num_slots, {hkv}, {d}]")
    if q_out is None:
        q_out = qkv.view(t, h + 2 * hkv, d)[:, :h]
    has_norm = q_norm_weight is not None
    q_w = q_norm_weight if has_norm else cos2  # placeholders, never read without norms
    k_w = k_norm_weight if has_norm else cos2
    check_tensors(_rope_write_kv_kernel, qkv=qkv, cos=cos2, sin=sin2, slot_mapping=slot_mapping,
                  k_cache=k_cache, v_cache=v_cache, q_out=q_out, q_norm_weight=q_w,
                  k_norm_weight=k_w)
    if t:
        half_p2 = next_pow2(d // 2)
        block_h = max(1, min(next_pow2(h + hkv), 512 // half_p2))
        _rope_write_kv_kernel[(t, cdiv(h + hkv, block_h))](
            qkv, cos2, sin2, slot_mapping, k_cache, v_cache, q_out, q_w, k_w, float(eps),
            qkv.stride(0), cos2.stride(0), sin2.stride(0), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), q_out.stride(0), q_out.stride(1),
            H=h, HKV=hkv, HEAD_DIM=d, HALF_P2=half_p2, BLOCK_H=block_h, HAS_NORM=has_norm,
            UNIT_OFFSET=bool(unit_offset), num_warps=4, enable_fp_fusion=True)
    return q_out
