"""Unified paged attention: one Triton kernel for decode (1 query), verification (1 + k queries,
causal among themselves) and prefill chunks (whose keys include earlier chunks), reading keys
and values straight from the paged cache through the block table (no gather, no mask tensor).

Layout. q [T, H, D] holds the new tokens of every request one after another (request r's rows
are query_start_loc[r] .. query_start_loc[r + 1]); the caches are [num_slots, Hkv, D] with
slot = block_tables[r, j // block_size] * block_size + j % block_size for key j of request r
(the layout `attention/sdpa_backend.write_kv` writes). seq_lens[r] counts request r's keys, its
new tokens included, so its query i sits at position seq_lens[r] - qlen_r + i and attends keys
0 .. that position (within the sliding window, when there is one: keys j with
position - window < j <= position). A request with 0 queries or 0 keys (CUDA-graph padding)
reads nothing and writes nothing.

Grid: (query blocks, KV heads). A program takes BLOCK_Q consecutive queries of one request and
the rep = H / Hkv query heads that share one KV head, packed as the BLOCK_Q * rep rows of one
tile (grouped-query attention: each key/value tile is loaded once for all of them). The query
blocks are numbered query_start_loc[r] // BLOCK_Q + r + i, so the grid needs only T and the
number of requests (no host sync, graph capturable); a program finds its request by a binary
search over query_start_loc, and surplus programs exit at once.

Why this order (batch invariance). A row walks the keys in tiles of a fixed BLOCK_N from key 0
(or from the tile holding its window's first key), in ascending order, with an online softmax:
each tile rescales the running max, sum and accumulator. Tiles fully masked for a row leave its
state bit-for-bit unchanged (exp(-inf) = 0; the max is guarded against -inf - -inf), so a row's
result depends only on its own position and keys, not on its tile mates, the request's query
count, the batch, or how a prefill was chunked. BLOCK_Q and BLOCK_N depend only on the head
size, the dtype and rep, never on the batch, and there is no split over the keys, so decode and
verification agree to the bit. Scores are computed in float32 (float32 inputs in IEEE float32,
not TF32), soft-capped as softcap * tanh(s / softcap) before the mask (Gemma 2).
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels.triton.support import check_tensors, jit, next_pow2, tl


@jit
def _unified_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
        num_reqs, scale, softcap, window,
        stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
        stride_bt,
        REP: tl.constexpr, REP_P2: tl.constexpr, HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
        BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
        USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    # The request of this query block: the last r with query_start_loc[r] // BLOCK_Q + r <= pid.
    lo = 0
    hi = num_reqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(first <= pid, mid, lo)
        hi = tl.where(first <= pid, hi, mid - 1)
    r = lo
    q_start = tl.load(qsl_ptr + r)
    q_len = tl.load(qsl_ptr + r + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + r)
    seq_len = tl.load(seq_lens_ptr + r)
    if (q_block * BLOCK_Q >= q_len) | (seq_len <= 0):
        return
    context = seq_len - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * REP_P2
    offs_m = tl.arange(0, BLOCK_M)
    qi = q_block * BLOCK_Q + offs_m // REP_P2          # [BLOCK_M] query index in the request
    head = kvh * REP + offs_m % REP_P2                 # [BLOCK_M] query head
    row_ok = (qi < q_len) & (offs_m % REP_P2 < REP)
    pos = context + qi                                 # [BLOCK_M] the row's position
    offs_d = tl.arange(0, D_P2)
    d_ok = offs_d < HEAD_DIM

    tok = (q_start + qi).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_M, D_P2]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_P2], tl.float32)

    first_pos = context + q_block * BLOCK_Q
    key_end = tl.minimum(first_pos + BLOCK_Q, seq_len)  # one past the block's last position
    key_begin = 0
    if USE_WINDOW:  # the tile holding the window's first key of the block's first query
        key_begin = (tl.maximum(first_pos - window + 1, 0) // BLOCK_N) * BLOCK_N
    table = block_tables_ptr + r * stride_bt
    for start_n in range(key_begin, key_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)        # [BLOCK_N] key positions
        n_ok = offs_n < seq_len
        block = tl.load(table + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = block * PAGE + offs_n % PAGE
        k = tl.load(k_cache_ptr + slot[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None],
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0)   # [D_P2, BLOCK_N]
        s = tl.dot(q, k, input_precision=PRECISION) * scale        # [BLOCK_M, BLOCK_N]
        if USE_SOFTCAP:  # softcap * tanh(s / softcap), tanh(x) = 1 - 2 / (exp(2x) + 1)
            x = tl.minimum(tl.maximum(s / softcap, -15.0), 15.0)
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))
        allowed = (offs_n[None, :] <= pos[:, None]) & n_ok[None, :]
        if USE_WINDOW:
            allowed = allowed & (offs_n[None, :] > pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + slot[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_N, D_P2]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def attention_tiles(head_dim: int, dtype: torch.dtype, rep: int) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_N): queries per tile and keys per step. Chosen from the head size, the
    dtype and the GQA ratio only (never the batch or query lengths: batch invariance). A tile
    has at least 16 rows (BLOCK_Q * rep, rep rounded up to a power of two), tl.dot's minimum."""
    d = next_pow2(head_dim)
    wide = dtype == torch.float32
    if d <= 64:
        block_n = 32 if wide else 64
    elif d <= 128:
        block_n = 32
    else:
        block_n = 16 if wide else 32
    return max(1, 16 // next_pow2(rep)), block_n


def unified_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      query_start_loc: torch.Tensor, block_size: int, scale: float,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Paged attention of every request's new queries over its cached keys.

    q: [T, H, D] (last dim contiguous; a view of the qkv projection works);
    k_cache, v_cache: [num_slots, Hkv, D], this step's keys/values already written;
    block_tables: [R, max_blocks] int32; seq_lens: [R] int32 (keys, new tokens included; 0 for
    padding); query_start_loc: [R + 1] int32 (cumulative query counts, last = T);
    sliding_window: None/0 = none; softcap: None/0 = none. Returns out [T, H, D] (rows of
    padded requests are left unwritten)."""
    t, h, d = q.shape                      # q, out: [T, H, D]
    hkv = k_cache.shape[1]                 # caches: [num_slots, Hkv, D]
    if h % hkv or k_cache.shape[2] != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    num_reqs = seq_lens.shape[0]           # seq_lens [R], query_start_loc [R + 1], tables [R, B]
    if query_start_loc.shape[0] != num_reqs + 1 or block_tables.shape[0] != num_reqs:
        raise ValueError(f"{num_reqs} requests, but query_start_loc has "
                         f"{query_start_loc.shape[0]} entries and block_tables "
                         f"{block_tables.shape[0]} rows")
    if out is None:
        out = torch.empty_like(q)
    check_tensors(_unified_attention_kernel, q=q, k_cache=k_cache, v_cache=v_cache, out=out,
                  block_tables=block_tables, seq_lens=seq_lens, query_start_loc=query_start_loc)
    if t == 0 or num_reqs == 0:
        return out
    rep = h // hkv
    block_q, block_n = attention_tiles(d, q.dtype, rep)
    window = int(sliding_window or 0)
    cap = float(softcap or 0.0)
    grid = (t // block_q + num_reqs, hkv)
    _unified_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        num_reqs, float(scale), cap, window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
        v_cache.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        REP=rep, REP_P2=next_pow2(rep), HEAD_DIM=d, D_P2=next_pow2(d), BLOCK_Q=block_q,
        BLOCK_N=block_n, PAGE=block_size, USE_WINDOW=window > 0, USE_SOFTCAP=cap > 0.0,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4,
        enable_fp_fusion=True)
    return out
