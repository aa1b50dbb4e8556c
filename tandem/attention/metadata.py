"""Attention metadata for one forward pass over a flat batch of tokens.

Requests are laid out one after another in the flat token dimension. On the CPU every request of
the step, whatever its number of queries (decode, verification, prefill chunk), goes to one call
of the paged-attention kernel (kernels/cpu_attention.c), which reads each request's own key
slots (`requests`, `kv_slots`): one kernel for every query length, so a token's attention never
depends on how many queries its request verifies or on how its prompt was chunked.

Where that kernel does not apply (CUDA, head sizes it refuses, no C compiler) requests are split
into groups for SDPA (consecutive requests); each group is padded to [G, Qmax] queries and
[G, Lmax] keys gathered from the paged cache by slot id. Only a request's own slots are read
(padding reads the null block), so stale values in a block's unused tail can never reach another
request. Decode and verification steps (a few queries each) share one group; each long prefill
chunk gets its own, so padding never multiplies a prefill's cost. The groups are built on first
use, once per forward, and shared by all layers.

On the Triton path (CUDA, `kernels/triton_route.py`) the metadata carries `paged` instead: the
unified kernel's int32 device view of the block tables (built by worker/graph_inputs.py, padded
requests with 0 keys), and an int32 slot mapping where -1 skips a padded token's KV write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

# SDPA: requests with at most this many new tokens are batched into one padded group.
SMALL_QUERY = 16


@dataclass
class AttnGroup:
    start: int                # flat token index of the group's first query
    num_queries: int          # real queries in the group (sum of its requests' new tokens)
    q_pos: torch.Tensor       # [G, Qmax] int64 position of each query (padding -> 0)
    kv_slots: torch.Tensor    # [G, Lmax] int64 cache slot of key position j (padding -> slot 0,
                              # in the always-zero null block)
    full_causal: bool         # one request whose queries are all its keys: plain causal attention
    small: bool               # decode/verify-sized queries (<= SMALL_QUERY each)
    # Set only when the group's requests have different query lengths (padded rows exist):
    q_index: Optional[torch.Tensor] = None    # [G, Qmax] flat token index of each query (pad -> 0)
    valid_rows: Optional[torch.Tensor] = None  # [Nq] rows of the flattened [G * Qmax] that are real
    out_index: Optional[torch.Tensor] = None   # [Nq] flat token index of each real query row
    _masks: dict[tuple, torch.Tensor] = field(default_factory=dict)

    @property
    def uniform(self) -> bool:
        """Every request has Qmax queries, so the group's queries are one contiguous slice."""
        return self.q_index is None

    def mask(self, sliding_window: Optional[int], rows_per_query: int = 1,
             dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """[G, 1, rows_per_query * Qmax, Lmax], True/0 = may attend. Bool when dtype is None, else
        additive (0 / -inf) in dtype. Row r * Qmax + i belongs to query i: the grouped-heads
        layout of the decode path puts the query heads sharing one KV head in consecutive rows."""
        key = (sliding_window, rows_per_query, dtype)
        if key not in self._masks:
            j = torch.arange(self.kv_slots.shape[1], device=self.kv_slots.device)
            pos = self.q_pos.unsqueeze(-1)  # [G, Qmax, 1]
            m = j <= pos
            if sliding_window is not None:
                m = m & (j > pos - sliding_window)
            m = m.unsqueeze(1)  # [G, 1, Qmax, Lmax]
            if rows_per_query > 1:
                m = m.repeat(1, 1, rows_per_query, 1)
            if dtype is not None:
                m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m,
                                                                                   float("-inf"))
            self._masks[key] = m
        return self._masks[key]


@dataclass
class PagedView:
    """What the unified Triton attention kernel reads (int32, on the model's device)."""
    block_tables: torch.Tensor     # [R, max_blocks] each request's blocks (unused tail: stale)
    seq_lens: torch.Tensor         # [R] keys of each request, new tokens included (padding: 0)
    query_start_loc: torch.Tensor  # [R + 1] first flat token of each request, then the total
    padded: bool = False           # padding rows exist: attention zeroes its output first


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64 cache slot where each new token's K/V is written
    num_tokens: int
    # The kernel's view of every request (CPU only, else None): [N, 3] int64 flat index of the
    # first query, queries, keys; and [N, Lmax] int64 each request's key slots (padding -> 0).
    requests: Optional[torch.Tensor]
    kv_slots: Optional[torch.Tensor]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    block_size: int
    device: torch.device
    _groups: Optional[list[AttnGroup]] = None
    paged: Optional[PagedView] = None  # the Triton path's view (then requests/kv_slots are None)

    @property
    def groups(self) -> list[AttnGroup]:
        """The SDPA groups (see the module's docstring), built on first use."""
        if self._groups is None:
            self._groups = _groups(self.query_lens, self.seq_lens, self.block_tables,
                                   self.block_size, self.device)
        return self._groups


def build_attention_metadata(query_lens: list[int], seq_lens: list[int],
                             block_tables: list[list[int]], block_size: int,
                             device: torch.device) -> AttentionMetadata:
    """query_lens[i] new tokens of request i end at position seq_lens[i] - 1."""
    n = len(query_lens)
    lmax = max(seq_lens, default=0)
    # [N, Lmax] slot of each request's key j: its table's block j // block_size, slot 0 past
    # each request's keys (numpy: a decode step's handful of small arrays costs a few us).
    width = max((len(t) for t in block_tables), default=0)
    tables = np.array([t + [0] * (width - len(t)) for t in block_tables],
                      dtype=np.int64).reshape(n, width)
    pos = np.arange(lmax)
    seq = np.array(seq_lens, dtype=np.int64)
    qlen = np.array(query_lens, dtype=np.int64)
    kv_slots = np.ascontiguousarray(tables[:, pos // block_size] * block_size
                                    + pos % block_size)  # [N, Lmax], row-major
    kv_slots[pos >= seq[:, None]] = 0
    # [T] the new tokens' slots: request i's keys seq - qlen .. seq - 1, in request order.
    starts = np.cumsum(qlen) - qlen
    req_of = np.repeat(np.arange(n), qlen)
    tok_pos = (seq - qlen - starts)[req_of] + np.arange(int(qlen.sum()))
    slot_mapping = torch.from_numpy(kv_slots[req_of, tok_pos])
    cpu = device.type == "cpu"
    return AttentionMetadata(
        slot_mapping=slot_mapping.to(device), num_tokens=int(qlen.sum()),
        requests=torch.from_numpy(np.stack((starts, qlen, seq), 1)) if cpu else None,
        kv_slots=torch.from_numpy(kv_slots) if cpu else None, query_lens=query_lens,
        seq_lens=seq_lens, block_tables=block_tables, block_size=block_size, device=device)


def _groups(query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
            block_size: int, device: torch.device) -> list[AttnGroup]:
    starts: list[int] = []
    offset = 0
    for qlen in query_lens:
        starts.append(offset)
        offset += qlen
    groups: list[AttnGroup] = []
    i = 0
    n = len(query_lens)
    while i < n:
        j = i + 1
        if query_lens[i] <= SMALL_QUERY:
            while j < n and query_lens[j] <= SMALL_QUERY:
                j += 1
        groups.append(_group(range(i, j), starts, query_lens, seq_lens, block_tables,
                              block_size, device))
        i = j
    return groups


def _group(members: range, starts: list[int], query_lens: list[int], seq_lens: list[int],
           block_tables: list[list[int]], block_size: int, device: torch.device) -> AttnGroup:
    qmax = max(query_lens[r] for r in members)
    lmax = max(seq_lens[r] for r in members)
    q_pos, kv_slots = [], []
    for r in members:
        qlen, slen, table = query_lens[r], seq_lens[r], block_tables[r]
        q_pos.append(list(range(slen - qlen, slen)) + [0] * (qmax - qlen))
        kv_slots.append([table[p // block_size] * block_size + p % block_size
                         for p in range(slen)] + [0] * (lmax - slen))
    r0 = members[0]
    group = AttnGroup(
        start=starts[r0], num_queries=sum(query_lens[r] for r in members),
        q_pos=torch.tensor(q_pos, dtype=torch.long, device=device),
        kv_slots=torch.tensor(kv_slots, dtype=torch.long, device=device),
        full_causal=len(members) == 1 and query_lens[r0] == seq_lens[r0],
        small=qmax <= SMALL_QUERY)
    if any(query_lens[r] != qmax for r in members):
        q_index = [list(range(starts[r], starts[r] + query_lens[r])) + [0] * (qmax - query_lens[r])
                   for r in members]
        valid = [[True] * query_lens[r] + [False] * (qmax - query_lens[r]) for r in members]
        group.q_index = torch.tensor(q_index, dtype=torch.long, device=device)
        valid_t = torch.tensor(valid, dtype=torch.bool, device=device)
        group.valid_rows = valid_t.view(-1).nonzero().view(-1)
        group.out_index = group.q_index[valid_t]
    return group
