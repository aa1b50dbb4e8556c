"""A step's inputs for the Triton path, in persistent int32 buffers a CUDA graph can hold.

One flat int32 tensor on the model's device holds every input of a step, with a host twin
(pinned on CUDA). A step writes the host twin and sends the prefix it uses in one non-blocking
copy, so a captured graph's kernels always read the same addresses, and filling them never waits
on the device (nothing is read back). Layout, each part at a fixed offset:

    input_ids [max_tokens] | positions [max_tokens] | slot_mapping [max_tokens] |
    logits rows [max_tokens] | seq_lens [max_reqs] | query_start_loc [max_reqs + 1] |
    block_tables [max_reqs, width]

with the block tables last, so a step copies only its own requests' rows of them.

Padding to a graph's bucket (`fill(..., tokens, reqs)` beyond the batch's own counts): a padded
token has id 0, position 0 and slot -1 (its KV write is skipped); a padded request has 0 keys
and 0 queries (its query_start_loc entries stay at the batch's token count), so attention reads
nothing for it and leaves its rows alone. Those rows carry garbage that no logits row reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import torch

from tandem.attention.metadata import AttentionMetadata, PagedView

I32 = torch.int32


@dataclass
class StepInputs:
    input_ids: torch.Tensor   # [tokens] int32, on the device (views of the persistent buffer)
    positions: torch.Tensor   # [tokens] int32
    rows: torch.Tensor        # [N] int32 the flat rows whose logits the step needs
    meta: AttentionMetadata   # slot mapping and the paged view, for forward_context


class InputBuffers:
    """Persistent step inputs for up to `max_tokens` tokens and `max_reqs` requests of at most
    `width` blocks each."""

    def __init__(self, max_tokens: int, max_reqs: int, width: int, block_size: int,
                 device: torch.device) -> None:
        self.max_tokens, self.max_reqs, self.width = max_tokens, max_reqs, width
        self.block_size, self.device = block_size, device
        t, r = max_tokens, max_reqs
        self._offsets = {"ids": 0, "pos": t, "slots": 2 * t, "rows": 3 * t, "seq": 4 * t,
                         "qsl": 4 * t + r, "tables": 4 * t + 2 * r + 1}
        size = self._offsets["tables"] + r * width
        self.device_buf = torch.zeros(size, dtype=I32, device=device)  # [size]
        # Pinned: a non-blocking copy from pageable memory is staged synchronously by the driver.
        self.host = torch.zeros(size, dtype=I32, pin_memory=device.type == "cuda")
        self._copied: Optional[torch.cuda.Event] = None  # the last step's copy (CUDA)

    def fits(self, tokens: int, reqs: int, widest: int) -> bool:
        return tokens <= self.max_tokens and reqs <= self.max_reqs and widest <= self.width

    def _part(self, buf: torch.Tensor, name: str, n: int) -> torch.Tensor:
        return buf.narrow(0, self._offsets[name], n)

    def tables(self, buf: torch.Tensor, reqs: int) -> torch.Tensor:
        return buf.narrow(0, self._offsets["tables"], reqs * self.width).view(reqs, self.width)

    def views(self, tokens: int, reqs: int, num_rows: int, padded: bool) -> StepInputs:
        """The device views a step of `tokens` tokens and `reqs` requests reads (the same
        addresses at every step of that size: what a graph captures)."""
        d = self.device_buf
        paged = PagedView(block_tables=self.tables(d, reqs),
                          seq_lens=self._part(d, "seq", reqs),
                          query_start_loc=self._part(d, "qsl", reqs + 1), padded=padded)
        # The SDPA groups' lists stay empty: the Triton path never reads them.
        meta = AttentionMetadata(slot_mapping=self._part(d, "slots", tokens), num_tokens=tokens,
                                 requests=None, kv_slots=None, query_lens=[], seq_lens=[],
                                 block_tables=[], block_size=self.block_size,
                                 device=self.device, paged=paged)
        return StepInputs(self._part(d, "ids", tokens), self._part(d, "pos", tokens),
                          self._part(d, "rows", num_rows), meta)

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor, query_lens: list[int],
             seq_lens: list[int], block_tables: list[list[int]], rows: torch.Tensor,
             tokens: int, reqs: int) -> StepInputs:
        """Write a batch (host tensors ids/positions [T], rows [N]; request i has query_lens[i]
        new tokens ending at key seq_lens[i] - 1), padded to `tokens` tokens and `reqs`
        requests, and send it to the device in one copy. Returns the device views."""
        n_tok, n_req = int(input_ids.shape[0]), len(query_lens)
        if not (n_tok <= tokens <= self.max_tokens and n_req <= reqs <= self.max_reqs):
            raise ValueError(f"a step of {n_tok} tokens and {n_req} requests, padded to "
                             f"{tokens} and {reqs}, does not fit buffers of {self.max_tokens} "
                             f"tokens and {self.max_reqs} requests")
        if self._copied is not None:  # the previous step's copy has long run: a formality
            self._copied.synchronize()
        h, bs, width = self.host, self.block_size, self.width
        self._write_tables(block_tables)
        qlen = torch.tensor(query_lens, dtype=torch.long)                   # [R]
        req_of = torch.repeat_interleave(torch.arange(n_req), qlen)        # [T]
        pos = positions.long()                                              # [T]
        flat = self.tables(h, max(n_req, 1)).reshape(-1)
        slots = flat[req_of * width + pos // bs].long() * bs + pos % bs     # [T]
        self._put(h, "ids", input_ids, tokens, 0)
        self._put(h, "pos", pos, tokens, 0)
        self._put(h, "slots", slots, tokens, -1)
        self._put(h, "rows", rows, rows.shape[0], 0)
        self._put(h, "seq", torch.tensor(seq_lens, dtype=torch.long), reqs, 0)
        qsl = torch.zeros(n_req + 1, dtype=torch.long)
        torch.cumsum(qlen, 0, out=qsl[1:])
        self._put(h, "qsl", qsl, reqs + 1, n_tok)
        end = self._offsets["tables"] + reqs * width
        self.device_buf[:end].copy_(h[:end], non_blocking=True)  # the step's one copy
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        return self.views(tokens, reqs, int(rows.shape[0]), tokens > n_tok or reqs > n_req)

    def _put(self, h: torch.Tensor, name: str, values: torch.Tensor, n: int, pad: int) -> None:
        """values [k] into part `name`'s first k entries, `pad` in the next n - k."""
        part = self._part(h, name, n)
        k = int(values.shape[0])
        part[:k].copy_(values)
        part[k:].fill_(pad)

    def _write_tables(self, block_tables: list[list[int]]) -> None:
        """Each request's blocks into its row (entries past them are never read: stale)."""
        lens = torch.tensor([len(t) for t in block_tables], dtype=torch.long)  # [R]
        total = int(lens.sum())
        if total == 0:
            return
        blocks = torch.tensor(list(itertools.chain.from_iterable(block_tables)), dtype=I32)
        req = torch.repeat_interleave(torch.arange(len(block_tables)), lens)   # [total]
        col = torch.arange(total) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        flat = self.tables(self.host, len(block_tables)).view(-1)
        flat.index_copy_(0, req * self.width + col, blocks)
