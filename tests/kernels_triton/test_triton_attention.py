"""The unified paged-attention kernel (tandem/kernels/triton/paged_attention.py) under Triton's
interpreter: against a float64 torch reference for decode, verification, prefill chunks over
earlier chunks, GQA, sliding windows, soft-caps and CUDA-graph padding; bit-identical rows
whatever the batch, the row's place in it, its request's query count or the prefill's chunking;
and checks that each masking rule the tests rely on changes the answer (so a kernel that
dropped one would fail)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

PAGE = 16


@dataclass
class Req:
    seq_len: int   # keys, the new tokens included (0: padding)
    q_len: int     # new tokens


class Cache:
    """A paged cache holding every request's keys 0 .. max, in shuffled blocks (block 0 unused,
    as the engine's null block), with per-position queries, so any batch of (request, query
    count, keys) can be laid out from the same values."""

    def __init__(self, max_lens: list[int], h: int, hkv: int, d: int, dtype: torch.dtype,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        blocks = [-(-n // PAGE) for n in max_lens]
        order = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
        self.tables, at = [], 0
        for b in blocks:
            self.tables.append(order[at:at + b])
            at += b
        slots = (sum(blocks) + 1) * PAGE
        self.k = torch.randn(slots, hkv, d, generator=g).to(dtype)
        self.v = torch.randn(slots, hkv, d, generator=g).to(dtype)
        self.q = [torch.randn(n, h, d, generator=g).to(dtype) for n in max_lens]
        self.width = max(blocks) + 1

    def batch(self, reqs: list[tuple[int, Req]]):
        """(q [T, H, D], block_tables, seq_lens, query_start_loc) for (request index, Req)s;
        a padding Req (seq_len 0) gets a table of -1s, which the kernel must never read."""
        qs, tables, lens, starts = [], [], [], [0]
        for idx, r in reqs:
            table = self.tables[idx] if r.seq_len else []
            tables.append(table + [-1] * (self.width - len(table)))
            lens.append(r.seq_len)
            if r.seq_len:
                qs.append(self.q[idx][r.seq_len - r.q_len:r.seq_len])
            else:
                qs.append(self.q[0][:0].new_zeros((r.q_len,) + self.q[0].shape[1:]))
            starts.append(starts[-1] + r.q_len)
        i32 = dict(dtype=torch.int32)
        return (torch.cat(qs), torch.tensor(tables, **i32), torch.tensor(lens, **i32),
                torch.tensor(starts, **i32))


def reference(q, k_cache, v_cache, tables, seq_lens, starts, scale, window=0, softcap=0.0,
              causal=True):
    """float64 attention per request from the same paged cache; padded rows are NaN."""
    out = torch.full(q.shape, float("nan"), dtype=torch.float64)
    h, hkv = q.shape[1], k_cache.shape[1]
    for r in range(seq_lens.shape[0]):
        n, a, b = int(seq_lens[r]), int(starts[r]), int(starts[r + 1])
        if n == 0 or a == b:
            continue
        slots = torch.tensor([tables[r, j // PAGE] * PAGE + j % PAGE for j in range(n)])
        k = k_cache[slots].double().repeat_interleave(h // hkv, 1)  # [n, H, D]
        v = v_cache[slots].double().repeat_interleave(h // hkv, 1)
        s = torch.einsum("qhd,khd->hqk", q[a:b].double(), k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(n - (b - a), n)[:, None]
        j = torch.arange(n)[None, :]
        allowed = j <= pos if causal else torch.ones_like(j <= pos)
        if window:
            allowed = allowed & (j > pos - window)
        s = s.masked_fill(~allowed, float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)
    return out


def run(tk, cache: Cache, reqs, scale=0.3, window=0, softcap=0.0):
    q, tables, lens, starts = cache.batch(reqs)
    out = torch.full_like(q, 7.0)  # rows the kernel must not write keep this
    got = tk.paged_attention.unified_attention(q, cache.k, cache.v, tables, lens, starts, PAGE,
                                               scale, window, softcap, out=out)
    assert got is out
    return q, tables, lens, starts, out


# (H, Hkv, D, dtype, window, softcap): every head size and GQA ratio asked for, kept tiny.
CASES = [
    (2, 2, 16, torch.float32, 0, 0.0),
    (4, 2, 16, torch.float32, 7, 0.0),
    (4, 2, 16, torch.float32, 0, 2.0),
    (6, 2, 16, torch.float32, 0, 0.0),    # rep 3: a tile's rows padded to 4 heads per query
    (8, 2, 64, torch.float32, 20, 0.0),
    (2, 1, 128, torch.float32, 0, 0.0),
    (4, 2, 64, torch.float16, 9, 3.0),
]


@pytest.mark.parametrize("h,hkv,d,dtype,window,softcap", CASES)
def test_matches_reference(tk, h, hkv, d, dtype, window, softcap):
    # decode, verification (1 + 3), a prefill chunk over an earlier chunk, a first chunk, a
    # request with no new tokens and a padded token (0 keys); the long ones span key tiles
    cache = Cache([45, 21, 50, 19, 30], h, hkv, d, dtype)
    reqs = [(0, Req(45, 1)), (1, Req(21, 4)), (2, Req(50, 20)), (3, Req(19, 19)),
            (4, Req(30, 0)), (0, Req(0, 1))]
    scale = 0.3 if softcap == 0 else 1.0
    q, tables, lens, starts, out = run(tk, cache, reqs, scale, window, softcap)
    ref = reference(q, cache.k, cache.v, tables, lens, starts, scale, window, softcap)
    real = ~ref.isnan().any(-1).any(-1)
    assert real.sum() == q.shape[0] - 1
    tol = 2e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out[real].double(), ref[real], atol=tol, rtol=tol)
    assert (out[~real] == 7.0).all(), "a padded row was written"


def test_each_rule_changes_the_answer(tk):
    """The causal mask, the window and the cap each move the verification and prefill rows
    well past the tolerance above, so a kernel ignoring one of them fails those tests."""
    cache = Cache([40, 33], 4, 2, 16, torch.float32)
    q, tables, lens, starts = cache.batch([(0, Req(40, 5)), (1, Req(33, 13))])
    args = (q, cache.k, cache.v, tables, lens, starts)
    base = reference(*args, 1.0)
    not_last = torch.ones(q.shape[0], dtype=torch.bool)
    not_last[starts[1:] - 1] = False  # a request's last query sees every key either way
    for other, rows in ((reference(*args, 1.0, causal=False), not_last),
                        (reference(*args, 1.0, window=7), slice(None)),
                        (reference(*args, 1.0, softcap=2.0), slice(None))):
        assert (base - other).abs().amax(dim=(1, 2))[rows].min() > 1e-3
    out = tk.paged_attention.unified_attention(q, cache.k, cache.v, tables, lens, starts, PAGE,
                                               1.0)
    torch.testing.assert_close(out.double(), base, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("hkv,window,softcap", [(2, 0, 0.0), (1, 9, 2.0)])
def test_rows_are_batch_invariant(tk, hkv, window, softcap):
    """float32, bit for bit: a request's row at a position with the same keys is the same alone
    or in a batch (anywhere in it), decoded or inside a verification, and whatever chunks its
    prefill ran in."""
    h, d = 4, 16
    cache = Cache([70, 40, 25], h, hkv, d, torch.float32)

    def rows(reqs, which):  # the rows of batch entry `which` (positions seq_len - q_len ..)
        q, tables, lens, starts, out = run(tk, cache, reqs, 0.3, window, softcap)
        return out[int(starts[which]):int(starts[which + 1])]

    verify = rows([(0, Req(70, 5))], 0)  # positions 65 .. 69
    for i, p in enumerate(range(65, 70)):  # decoded one at a time
        assert torch.equal(rows([(0, Req(p + 1, 1))], 0)[0], verify[i])
    others = [(1, Req(40, 20)), (2, Req(25, 1)), (1, Req(0, 2))]
    assert torch.equal(rows(others + [(0, Req(70, 5))], 3), verify)
    assert torch.equal(rows([others[1], (0, Req(70, 5)), others[0]], 1), verify)
    whole = rows([(0, Req(70, 70))], 0)  # prefill in one chunk, or in two
    chunks = torch.cat([rows([(0, Req(41, 41)), others[1]], 0),
                        rows([others[0], (0, Req(70, 29))], 1)])
    assert torch.equal(whole, chunks)
    assert torch.equal(whole[65:], verify)
