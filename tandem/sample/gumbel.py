"""Drafter-invariant sampling by the Gumbel-max trick (rejection_sample_method "gumbel", and
"auto" for the sampled rows of seeded requests: `coupled_rows`).

Daliri, Musco and Suresh, "Coupling without Communication and Drafter-Invariant Speculative
Decoding" (2024). Each (request seed, output position) owns a noise vector g over the target's
vocabulary, g_v = -log(-log(u_v)) with u_v a keyed uniform of token v. The token at a position is
argmax_v (log p_v + g_v), p the processed distribution (penalties, temperature, min-p, top-k,
top-p, grammar mask): an exact sample from p. A draft proposes argmax_v (log q_v + g_v) with the
same g; verification accepts while the draft's token equals the target's and emits the target's
at the first mismatch. Every emitted token is therefore argmax(log p + g) at its position: a
function of (seed, position, p) alone, whatever the draft, k, batch or schedule.

Cheap: u_v has 32 bits, u = (x + 1/2) / 2^32 for a hashed x, so g lies in [G_MIN, G_MAX] ~
[-3.13, 22.87]. A token whose log p is more than G_MAX - g(top) below the top token's cannot win,
and gets no noise: only the candidates inside that window are hashed. Rounding u to 32 bits moves
probabilities by at most ~2^-32 relative, far below what any test or use can see.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from tandem.kernels import cpu_sampling
from tandem.sample.metadata import SamplingMetadata

_M32 = 0xFFFFFFFF
_SCALE = 1.0 / 2 ** 32
G_MAX = -math.log(-math.log1p(-0.5 * _SCALE))  # u = 1 - 2^-33, the largest uniform
G_MIN = -math.log(-math.log(0.5 * _SCALE))     # u = 2^-33, the smallest


def _h32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons): a bijection of 32-bit integers with good avalanche, on int64
    tensors holding values in [0, 2^32); products wrap in int64, their low 32 bits are exact."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def noise(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """keys: [N] int64 64-bit row keys (SeededRandom.noise_key, as signed int64); tokens: [N]
    int64 target token ids. Returns [N] float64 Gumbel noise g(key, token)."""
    lo, hi = keys & _M32, (keys >> 32) & _M32
    x = _h32(_h32(tokens ^ lo) ^ hi)
    u = (x.double() + 0.5) * _SCALE                       # (0, 1), 32 bits
    return -torch.log(-torch.log(u))


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


def coupled_rows(md: SamplingMetadata, method: str) -> list[bool]:
    """[B]: which rows draw by Gumbel-max under rejection_sample_method `method` (their draft
    proposes with the same noise, their verification compares tokens): every sampled row under
    "gumbel"; under "auto" the sampled rows of requests with their own seed, whose tokens must
    not depend on drafting (nor on the timing adaptive speculation reads); none otherwise.
    Greedy rows take the argmax under every method."""
    if method not in ("gumbel", "auto"):
        return [False] * md.num_rows
    sampled = [t != 0.0 for t in md.temperature.tolist()]
    if method == "gumbel":
        return sampled
    return [s and seeded for s, seeded in zip(sampled, md.seeded)]


def row_keys(md: SamplingMetadata, device: torch.device) -> torch.Tensor:
    """[B] int64: the noise key of each row at the position it decides."""
    return torch.tensor([_signed(r.noise_key(p)) for r, p in zip(md.rngs, md.positions)],
                        dtype=torch.int64, device=device)


def gumbel_argmax_torch(scores: torch.Tensor, keys: torch.Tensor,
                        token_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """scores: [B, V] float32 log-probabilities (-inf where forbidden; at least one finite per
    row); keys: [B] int64; token_ids: [V] int64, the target token whose noise column v reads
    (None: v itself; a TLI draft passes its columns' twins). Returns [B] int64
    argmax_v(scores + g(key, token_ids[v])), ties to the lower column, in torch ops over the
    whole row: the reference `gumbel_sample` is tested against."""
    num_rows, vocab = scores.shape
    top, top_col = scores.max(dim=-1)                                        # [B] each
    cols_key = top_col if token_ids is None else token_ids[top_col]
    g_top = noise(keys, cols_key)                                            # [B]
    # Anything below top + g_top - G_MAX loses to the top token whatever its noise; a small
    # margin covers float32 rounding (extra candidates never change the answer).
    floor = (top.double() + g_top - G_MAX - 1e-3).float()                    # [B]
    rows, cols = (scores >= floor.unsqueeze(1)).nonzero(as_tuple=True)      # [C] each
    return _pick(scores[rows, cols], rows, cols, keys, token_ids, num_rows, vocab)


def _pick(scores: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor,
          token_ids: Optional[torch.Tensor], num_rows: int, vocab: int) -> torch.Tensor:
    """The Gumbel-max over candidates (scores [C] at (rows, cols), row-major), in torch ops."""
    ids = cols if token_ids is None else token_ids[cols]
    value = scores.double() + noise(keys[rows], ids)                          # [C]
    best = torch.full((num_rows,), -math.inf, dtype=torch.float64, device=scores.device)
    best.scatter_reduce_(0, rows, value, reduce="amax")
    win = value == best[rows]
    out = torch.full((num_rows,), vocab, dtype=torch.int64, device=scores.device)
    return out.scatter_reduce_(0, rows[win], cols[win], reduce="amin")


def gumbel_sample(probs: torch.Tensor, keys: torch.Tensor,
                  token_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """probs: [B, V] (a row's distribution: penalties, temperature and filters applied); keys,
    token_ids as gumbel_argmax_torch. Returns gumbel_argmax_torch(torch.log(probs), keys,
    token_ids), the same tokens, without the logarithm of every column: only the columns that
    can win are taken (probability above the top column's times exp(g_top - G_MAX), less a
    margin: one pass of the C kernel), their logarithms by torch.log (the same bits
    elementwise), and the choice among them by the C kernel. On a 262k vocabulary that is a few
    hundred columns instead of all of them; in torch ops where the kernels are off."""
    num_rows, vocab = probs.shape
    if num_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=probs.device)
    fast = cpu_sampling.gumbel_candidates(probs, keys, token_ids)  # the columns that can win
    if fast is not None:
        start, cols = fast
        rows = torch.repeat_interleave(torch.arange(num_rows), start.diff())  # [C]
        scores = torch.log(probs[rows, cols])                                  # [C]
        ids = cols if token_ids is None else token_ids[cols].contiguous()
        out = cpu_sampling.gumbel_argmax_sparse(scores, start, ids, cols, keys)
        return out if out is not None else _pick(scores, rows, cols, keys, token_ids, num_rows,
                                                 vocab)
    top, top_col = probs.max(dim=-1)                                         # [B] each
    g_top = noise(keys, top_col if token_ids is None else token_ids[top_col])  # [B]
    # log p_v < log p_top + g_top - G_MAX loses to the top column whatever v's noise; 1e-3
    # covers the rounding of the logarithms and of the floor (extra candidates change nothing).
    floor = (torch.log(top.double()) + g_top - G_MAX - 1e-3).exp().to(probs.dtype)  # [B]
    # A row with a NaN (a broken draft, say) has a NaN top and floor: its NaN columns are its
    # candidates, and the first of them wins, as in the whole row's argmax.
    rows, cols = ((probs >= floor.unsqueeze(1)) | probs.isnan()).nonzero(as_tuple=True)  # [C]
    return _pick(torch.log(probs[rows, cols]), rows, cols, keys, token_ids, num_rows, vocab)
