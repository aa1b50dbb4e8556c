"""Attention layer: writes K/V to this layer's slice of the paged cache and attends over it."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from tandem.attention.context import get_forward_context
from tandem.attention.sdpa_backend import paged_attention, write_kv
from tandem.kernels import cpu as cpu_kernels
from tandem.layers.rotary import Rope, rotate_qk


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: Optional[int] = None, softcap: Optional[float] = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap  # Gemma 2: scores become softcap * tanh(scores / softcap)
        # Bound by the model runner to views of the engine's KV tensors: [num_slots, Hkv, D].
        self.k_cache: torch.Tensor = torch.empty(0)
        self.v_cache: torch.Tensor = torch.empty(0)

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
        if cpu_kernels.rope_write_kv(qkv, rope, meta.slot_mapping, self.k_cache, self.v_cache,
                                     h, hkv, d, q_norm, k_norm):
            q = qkv.view(t, h + 2 * hkv, d)[:, :h]  # rotated in place; k and v are cached
            out = paged_attention(q, self.k_cache, self.v_cache, meta, self.scale,
                                  self.sliding_window, self.softcap)
            return out.reshape(t, h * d)
        heads = qkv.view(t, h + 2 * hkv, d)
        q, k = rotate_qk(heads, rope, h, q_norm, k_norm)
        return self.forward(q, k, heads[:, h + hkv:])
