"""Attention metadata for one forward pass over a flat batch of tokens.

Requests are laid out one after another in the flat token dimension. For attention they are split
into groups (consecutive requests); each group is padded to [G, Qmax] queries and [G, Lmax] keys
gathered from the paged cache by slot id. Decode and verification steps (a few queries each) share
one group; each long prefill chunk gets its own, so padding never multiplies a prefill's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

# Requests with at most this many new tokens are batched together into one padded group.
SMALL_QUERY = 16


@dataclass
class AttnGroup:
    q_index: torch.Tensor    # [G, Qmax] int64 flat token index of each query (padding -> 0)
    q_pos: torch.Tensor      # [G, Qmax] int64 position of each query (padding -> 0)
    kv_slots: torch.Tensor   # [G, Lmax] int64 cache slot of key position j (padding -> slot 0,
                             # in the always-zero null block)
    full_causal: bool        # one request whose queries are all its keys: plain causal attention
    valid_rows: torch.Tensor  # [Nq] rows of the flattened [G * Qmax] queries that are real
    out_index: torch.Tensor   # [Nq] flat token index of each real query row
    _masks: dict[Optional[int], torch.Tensor] = field(default_factory=dict)

    def mask(self, sliding_window: Optional[int]) -> torch.Tensor:
        """[G, 1, Qmax, Lmax] bool, True = may attend; built once per forward, shared by layers."""
        if sliding_window not in self._masks:
            j = torch.arange(self.kv_slots.shape[1], device=self.kv_slots.device)
            pos = self.q_pos.unsqueeze(-1)  # [G, Qmax, 1]
            m = j <= pos
            if sliding_window is not None:
                m = m & (j > pos - sliding_window)
            self._masks[sliding_window] = m.unsqueeze(1)
        return self._masks[sliding_window]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64 cache slot where each new token's K/V is written
    groups: list[AttnGroup]
    num_tokens: int


def build_attention_metadata(query_lens: list[int], seq_lens: list[int],
                             block_tables: list[list[int]], block_size: int,
                             device: torch.device) -> AttentionMetadata:
    """query_lens[i] new tokens of request i end at position seq_lens[i] - 1."""
    slot_mapping: list[int] = []
    starts: list[int] = []
    offset = 0
    for qlen, slen, table in zip(query_lens, seq_lens, block_tables):
        starts.append(offset)
        offset += qlen
        for pos in range(slen - qlen, slen):
            slot_mapping.append(table[pos // block_size] * block_size + pos % block_size)
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
    return AttentionMetadata(torch.tensor(slot_mapping, dtype=torch.long, device=device),
                             groups, offset)


def _group(members: range, starts: list[int], query_lens: list[int], seq_lens: list[int],
           block_tables: list[list[int]], block_size: int, device: torch.device) -> AttnGroup:
    qmax = max(query_lens[r] for r in members)
    lmax = max(seq_lens[r] for r in members)
    q_index, q_valid, q_pos, kv_slots = [], [], [], []
    for r in members:
        qlen, slen, table = query_lens[r], seq_lens[r], block_tables[r]
        pad_q = qmax - qlen
        q_index.append(list(range(starts[r], starts[r] + qlen)) + [0] * pad_q)
        q_valid.append([True] * qlen + [False] * pad_q)
        q_pos.append(list(range(slen - qlen, slen)) + [0] * pad_q)
        kv_slots.append([table[p // block_size] * block_size + p % block_size
                         for p in range(slen)] + [0] * (lmax - slen))
    single = len(members) == 1
    r0 = members[0]
    q_index_t = torch.tensor(q_index, dtype=torch.long, device=device)
    q_valid_t = torch.tensor(q_valid, dtype=torch.bool, device=device)
    return AttnGroup(
        q_index=q_index_t,
        valid_rows=q_valid_t.view(-1).nonzero().view(-1), out_index=q_index_t[q_valid_t],
        q_pos=torch.tensor(q_pos, dtype=torch.long, device=device),
        kv_slots=torch.tensor(kv_slots, dtype=torch.long, device=device),
        full_causal=single and query_lens[r0] == seq_lens[r0])
