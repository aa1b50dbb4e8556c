"""Reference paged attention on torch's scaled_dot_product_attention (CPU and CUDA).

Writes the new keys/values into the paged cache by slot, then, per group, gathers each request's
keys/values by slot id into a padded batch and runs SDPA with a causal (optionally sliding) mask.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from tandem.attention.metadata import AttentionMetadata


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    # caches: [num_slots, Hkv, D]; k, v: [T, Hkv, D]
    k_cache.index_copy_(0, slot_mapping, k)
    v_cache.index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float,
                    sliding_window: Optional[int]) -> torch.Tensor:
    """q: [T, H, D] -> out [T, H, D]. Keys/values must already be written to the cache."""
    out = torch.empty_like(q)
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    for g in meta.groups:
        # index_select, not fancy indexing: the latter is ~1000x slower on CPU for these shapes.
        n, qmax = g.q_index.shape
        lmax = g.kv_slots.shape[1]
        qg = q.index_select(0, g.q_index.view(-1)).view(n, qmax, h, d).transpose(1, 2)
        kg = k_cache.index_select(0, g.kv_slots.view(-1)).view(n, lmax, hkv, d).transpose(1, 2)
        vg = v_cache.index_select(0, g.kv_slots.view(-1)).view(n, lmax, hkv, d).transpose(1, 2)
        # qg: [G, H, Qmax, D]; kg, vg: [G, Hkv, Lmax, D]
        gqa = qg.shape[1] != kg.shape[1]
        if g.full_causal and sliding_window is None:
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale,
                                                enable_gqa=gqa)
        else:
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask(sliding_window),
                                                scale=scale, enable_gqa=gqa)
        og = og.transpose(1, 2).reshape(n * qmax, h, d)  # [G * Qmax, H, D]
        out.index_copy_(0, g.out_index, og.index_select(0, g.valid_rows))
    return out
