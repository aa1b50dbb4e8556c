"""Paged attention: on the CPU in float32, the kernel of kernels/cpu.py for every request of the
step; elsewhere the reference on torch's scaled_dot_product_attention (CPU and CUDA).

The CPU kernel reads each request's keys and values straight from the cache (no gathers, no
mask), one query row at a time in a fixed order, whatever the number of queries: decode,
verification and prefill get the same bits for the same token (kernels/cpu_attention.c).

The reference writes nothing itself (layers write the cache first), then, per group, gathers each
request's keys/values by slot id into a padded batch and runs SDPA once for the whole group.
Decode and verification groups (a few queries per request) use a grouped-heads layout: the
query heads that share one KV head become rows of one attention problem, [G, Hkv, rep * Qmax, D]
against keys [G, Hkv, Lmax, D], with an additive mask built once per forward. Measured on CPU this
is about 2x faster than SDPA's own `enable_gqa` with a boolean mask (which converts the mask on
every call), and for one query per request the layout is a free view of q. Its bits depend on
the group's padding, so batch invariance holds only on the kernel's path.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from tandem.attention.kv_format import format_of
from tandem.attention.metadata import AttentionMetadata, AttnGroup
from tandem.kernels import cpu as cpu_kernels


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    # caches: [num_slots, Hkv, row] in their format (kv_format.py); k, v: [T, Hkv, D]
    fmt = format_of(k_cache)
    k_cache.index_copy_(0, slot_mapping, fmt.store(k))
    v_cache.index_copy_(0, slot_mapping, fmt.store(v))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float,
                    sliding_window: Optional[int], softcap: Optional[float] = None) -> torch.Tensor:
    """q: [T, H, D] -> out [T, H, D]. Keys/values must already be written to the cache.
    softcap: scores capped as softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
    if meta.requests is not None and cpu_kernels.attention_takes(q.shape[2]):
        out = q.new_empty(q.shape)
        if cpu_kernels.paged_attention(q, k_cache, v_cache, out, meta.requests, meta.kv_slots,
                                       scale, sliding_window, softcap):
            return out  # every request in one call, straight from the cache (kernels/cpu.py)
    q = format_of(k_cache).query(q).to(q.dtype)  # a q8_0 cache's scores: q quantized, as there
    groups = meta.groups
    if len(groups) == 1 and groups[0].uniform:
        return _attend(q, k_cache, v_cache, groups[0], scale, sliding_window, softcap)
    out = q.new_empty(q.shape)
    for g in groups:
        og = _attend(q, k_cache, v_cache, g, scale, sliding_window, softcap)  # [G * Qmax, H, D]
        if g.uniform:
            out.narrow(0, g.start, g.num_queries).copy_(og)
        else:
            out.index_copy_(0, g.out_index, og.index_select(0, g.valid_rows))
    return out


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: AttnGroup,
            scale: float, sliding_window: Optional[int],
            softcap: Optional[float] = None) -> torch.Tensor:
    """One group's attention: [G * Qmax, H, D], rows in the group's padded query order."""
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    n, qmax = g.q_pos.shape
    if g.uniform:
        qg = q.narrow(0, g.start, g.num_queries)  # [G * Qmax, H, D], a view
    else:
        # index_select, not fancy indexing: the latter is ~1000x slower on CPU for these shapes.
        qg = q.index_select(0, g.q_index.view(-1))
    kg, vg = _gather(k_cache, g, q.dtype), _gather(v_cache, g, q.dtype)  # [G, Hkv, Lmax, D]
    if softcap is not None:
        return _attend_softcap(qg.view(n, qmax, h, d).transpose(1, 2), kg, vg, g, scale,
                               sliding_window, softcap)
    if g.small and h % hkv == 0:
        rep = h // hkv
        # [G * Qmax, Hkv * rep, D] -> [G, Hkv, rep * Qmax, D] (row r * Qmax + i: query i, head r)
        qg = qg.reshape(n, qmax, hkv, rep, d)
        qg = qg.view(n, hkv, rep, d) if qmax == 1 else qg.permute(0, 2, 3, 1, 4).reshape(
            n, hkv, rep * qmax, d)
        og = F.scaled_dot_product_attention(qg, kg, vg, scale=scale,
                                            attn_mask=g.mask(sliding_window, rep, q.dtype))
        # reshape, not view: SDPA may return a non-contiguous layout (CUDA's float32 kernel does)
        if qmax == 1:
            return og.reshape(n, h, d)
        return og.reshape(n, hkv, rep, qmax, d).permute(0, 3, 1, 2, 4).reshape(n * qmax, h, d)
    qg = qg.view(n, qmax, h, d).transpose(1, 2)  # [G, H, Qmax, D]
    gqa = h != hkv
    if g.full_causal and sliding_window is None:
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale,
                                            enable_gqa=gqa)
    else:
        og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask(sliding_window),
                                            scale=scale, enable_gqa=gqa)
    return og.transpose(1, 2).reshape(n * qmax, h, d)


def _attend_softcap(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, g: AttnGroup,
                    scale: float, sliding_window: Optional[int], softcap: float) -> torch.Tensor:
    """Attention with capped scores (SDPA has no hook between the scores and the softmax):
    qg [G, H, Qmax, D], kg/vg [G, Hkv, Lmax, D] -> [G * Qmax, H, D]."""
    n, h, qmax, d = qg.shape
    rep = h // kg.shape[1]
    qg = qg.reshape(n, kg.shape[1], rep * qmax, d)  # the query heads sharing a KV head as rows
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * scale  # [G, Hkv, rep * Qmax, Lmax]
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores + g.mask(sliding_window, rep, scores.dtype)
    out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(vg.dtype), vg)
    return out.view(n, h, qmax, d).transpose(1, 2).reshape(n * qmax, h, d)


def _gather(cache: torch.Tensor, g: AttnGroup, dtype: torch.dtype) -> torch.Tensor:
    """cache [num_slots, Hkv, row] -> [G, Hkv, Lmax, D] in dtype, each request's keys in
    position order, widened from the cache's format."""
    _, hkv, row = cache.shape
    n, lmax = g.kv_slots.shape
    rows = cache.index_select(0, g.kv_slots.view(-1)).view(n, lmax, hkv, row)
    fmt = format_of(cache)
    if fmt.storage is not dtype:
        rows = fmt.load(rows).to(dtype)
    return rows.transpose(1, 2)
