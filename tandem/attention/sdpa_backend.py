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
    for g in meta.groups:
        qg = q[g.q_index].transpose(1, 2)              # [G, H, Qmax, D]
        kg = k_cache[g.kv_slots].transpose(1, 2)       # [G, Hkv, Lmax, D]
        vg = v_cache[g.kv_slots].transpose(1, 2)
        gqa = qg.shape[1] != kg.shape[1]
        if g.full_causal and sliding_window is None:
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale,
                                                enable_gqa=gqa)
        else:
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask(sliding_window),
                                                scale=scale, enable_gqa=gqa)
        og = og.transpose(1, 2)                        # [G, Qmax, H, D]
        out[g.q_index[g.q_valid]] = og[g.q_valid]
    return out
