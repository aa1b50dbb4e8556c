"""Attention layer: writes K/V to this layer's slice of the paged cache and attends over it.

Three paths, chosen per call: on the Triton route (CUDA; kernels/triton_route.py) two kernels,
q/k norm + rope + KV write, then unified paged attention over the block table, both reading only
int32 device buffers (graph capturable); on the CPU in float32 the fused C kernels; else torch
(rotate_qk, write_kv and the SDPA reference)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from tandem.attention.context import get_forward_context
from tandem.attention.kv_format import FORMATS, KVFormat
from tandem.attention.sdpa_backend import paged_attention, write_kv
from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import triton_route
from tandem.layers.rotary import Rope, rotate_qk


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: Optional[int] = None, softcap: Optional[float] = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap  # Gemma 2: scores become softcap * tanh(scores / softcap)
        # Bound by the engine (worker/kv_cache.py) to its KV tensors: [num_slots, Hkv, row], a
        # row one token's D numbers in the cache's format (attention/kv_format.py).
        self.k_cache: torch.Tensor = torch.empty(0)
        self.v_cache: torch.Tensor = torch.empty(0)
        self.kv_format: KVFormat = FORMATS["float32"]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]
        meta = get_forward_context()
        write_kv(self.k_cache, self.v_cache, k, v, meta.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, meta, self.scale, self.sliding_window,
                              self.softcap)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)

    def forward_qkv(self, qkv: torch.Tensor, rope: Rope, q_norm: Optional[nn.Module] = None,
                    k_norm: Optional[nn.Module] = None) -> torch.Tensor:
        """From the fused projection: qkv [T, (H + 2 Hkv) D] -> [T, H * D]. q and k heads are
        RMS-normalised per head when q_norm/k_norm are given (Qwen3, Gemma 3), then rotated.
        On the CPU in float32 one fused kernel does the norms, the rotation and the KV write,
        in place in qkv."""
        t = qkv.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        meta = get_forward_context()
        triton = triton_route.kernels_for(qkv)
        if triton is not None and meta.paged is not None and self.k_cache.dtype == qkv.dtype:
            return self._triton_qkv(triton, qkv, rope, q_norm, k_norm)
        if cpu_kernels.rope_write_kv(qkv, rope, meta.slot_mapping, self.k_cache, self.v_cache,
                                     h, hkv, d, q_norm, k_norm):
            q = qkv.view(t, h + 2 * hkv, d)[:, :h]  # rotated in place; k and v are cached
            out = paged_attention(q, self.k_cache, self.v_cache, meta, self.scale,
                                  self.sliding_window, self.softcap)
            return out.reshape(t, h * d)
        heads = qkv.view(t, h + 2 * hkv, d)
        q, k = rotate_qk(heads, rope, h, q_norm, k_norm)
        return self.forward(q, k, heads[:, h + hkv:])

    def _triton_qkv(self, triton: Any, qkv: torch.Tensor, rope: Rope,
                    q_norm: Optional[nn.Module], k_norm: Optional[nn.Module]) -> torch.Tensor:
        """The Triton path of forward_qkv: qkv [T, (H + 2 Hkv) D] -> [T, H * D]. Padded tokens
        (slot -1) write no KV; padded requests (0 keys) read nothing."""
        meta = get_forward_context()
        paged = meta.paged
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if not _same_norms(q_norm, k_norm):  # normalised here; the kernel rotates and writes
            heads = qkv.view(qkv.shape[0], h + 2 * hkv, d)
            if q_norm is not None:
                heads[:, :h] = q_norm(heads[:, :h])
            if k_norm is not None:
                heads[:, h:h + hkv] = k_norm(heads[:, h:h + hkv])
            q_norm = k_norm = None
        cos, sin = rope  # [T, 1, D] each
        q = triton.rope_kv.rope_write_kv(  # [T, H, D], rotated in place in qkv
            qkv, cos, sin, meta.slot_mapping, self.k_cache, self.v_cache, h, hkv, d,
            q_norm.weight if q_norm is not None else None,
            k_norm.weight if k_norm is not None else None,
            q_norm.eps if q_norm is not None else 1e-6,
            bool(q_norm is not None and q_norm.unit_offset))
        # Padded rows are left unwritten by the kernel: zeroed, so they stay finite (one memset,
        # in graphed steps only, where launches cost nothing extra).
        out = q.new_zeros(q.shape) if paged.padded else None
        out = triton.paged_attention.unified_attention(  # [T, H, D]
            q, self.k_cache, self.v_cache, paged.block_tables, paged.seq_lens,
            paged.query_start_loc, meta.block_size, self.scale, self.sliding_window,
            self.softcap, out=out)
        return out.reshape(qkv.shape[0], h * d)


def _same_norms(q_norm: Optional[nn.Module], k_norm: Optional[nn.Module]) -> bool:
    """Whether the fused kernel can apply both: one eps and one weight form for q and k (every
    model's case; Olmo 2 normalises its whole projection before this layer and passes none)."""
    if q_norm is None or k_norm is None:
        return q_norm is None and k_norm is None
    return (getattr(q_norm, "eps", None) == getattr(k_norm, "eps", None) is not None
            and getattr(q_norm, "unit_offset", None) == getattr(k_norm, "unit_offset", None)
            and q_norm.weight.dim() == 1)
