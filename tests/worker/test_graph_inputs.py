"""The persistent step inputs of the Triton path (worker/graph_inputs.py) and the graph runner's
bucket choice (worker/graph_runner.py), on the CPU: what one step writes, how it is padded to a
bucket (slot -1, 0 keys, 0 queries), that the views keep their addresses from step to step (what
a captured graph reads), and which batches get a graph."""

from __future__ import annotations

import pytest
import torch

from tandem.worker.graph_inputs import InputBuffers
from tandem.worker.graph_runner import GraphPlan, pick_bucket

BS = 4  # block size


def buffers() -> InputBuffers:
    return InputBuffers(max_tokens=16, max_reqs=4, width=5, block_size=BS,
                        device=torch.device("cpu"))


def fill(buf: InputBuffers, tokens: int, reqs: int):
    # request 0: a verification of 3 tokens at positions 5-7 (blocks 9, 2); request 1: one
    # decode token at position 8 (blocks 4, 7, 1)
    ids = torch.tensor([11, 12, 13, 14])
    positions = torch.tensor([5, 6, 7, 8])
    rows = torch.tensor([0, 1, 2, 3])
    return buf.fill(ids, positions, [3, 1], [8, 9], [[9, 2], [4, 7, 1]], rows, tokens, reqs)


def test_a_step_is_written_as_the_kernels_read_it():
    step = fill(buffers(), 4, 2)
    meta, paged = step.meta, step.meta.paged
    assert step.input_ids.tolist() == [11, 12, 13, 14] and step.positions.tolist() == [5, 6, 7, 8]
    # slot = table[pos // 4] * 4 + pos % 4
    assert meta.slot_mapping.tolist() == [2 * BS + 1, 2 * BS + 2, 2 * BS + 3, 1 * BS + 0]
    assert paged.seq_lens.tolist() == [8, 9] and paged.query_start_loc.tolist() == [0, 3, 4]
    assert paged.block_tables[0, :2].tolist() == [9, 2]
    assert paged.block_tables[1, :3].tolist() == [4, 7, 1]
    assert step.rows.tolist() == [0, 1, 2, 3] and not paged.padded
    assert meta.requests is None and meta.kv_slots is None  # the CPU kernels' view stays off
    assert all(t.dtype == torch.int32 for t in (step.input_ids, meta.slot_mapping,
                                               paged.block_tables, paged.seq_lens))


def test_padding_reads_nothing_and_writes_no_kv():
    step = fill(buffers(), 8, 4)  # padded to 4 requests of up to 2 tokens
    paged = step.meta.paged
    assert paged.padded and step.input_ids.shape == (8,) and paged.seq_lens.shape == (4,)
    assert step.meta.slot_mapping.tolist()[4:] == [-1] * 4           # no KV write
    assert step.input_ids.tolist()[4:] == [0] * 4 and step.positions.tolist()[4:] == [0] * 4
    assert paged.seq_lens.tolist() == [8, 9, 0, 0]                    # no keys
    assert paged.query_start_loc.tolist() == [0, 3, 4, 4, 4]          # no queries


def test_views_keep_their_addresses_and_a_smaller_step_rewrites_them():
    buf = buffers()
    first = fill(buf, 8, 4)
    again = buf.fill(torch.tensor([5]), torch.tensor([3]), [1], [4], [[6]], torch.tensor([0]),
                     8, 4)
    for a, b in ((first.input_ids, again.input_ids), (first.meta.slot_mapping,
                                                      again.meta.slot_mapping),
                 (first.meta.paged.block_tables, again.meta.paged.block_tables)):
        assert a.data_ptr() == b.data_ptr()  # what a graph captured reads the new step
    assert first.meta.slot_mapping.tolist() == [6 * BS + 3] + [-1] * 7  # the old step is gone
    assert first.meta.paged.seq_lens.tolist() == [4, 0, 0, 0]
    assert first.meta.paged.query_start_loc.tolist() == [0, 1, 1, 1, 1]


def test_an_empty_step_is_all_padding():
    empty = torch.zeros(0, dtype=torch.long)
    step = buffers().fill(empty, empty, [], [], [], empty, 6, 3)  # what capture runs
    assert step.meta.slot_mapping.tolist() == [-1] * 6
    assert step.meta.paged.seq_lens.tolist() == [0, 0, 0]
    assert step.meta.paged.query_start_loc.tolist() == [0, 0, 0, 0]


def test_a_step_beyond_the_buffers_is_refused():
    buf = buffers()
    assert buf.fits(16, 4, 5) and not buf.fits(17, 4, 5) and not buf.fits(4, 4, 6)
    with pytest.raises(ValueError, match="2 requests, padded to 4 and 1, does not fit"):
        fill(buf, 4, 1)  # padded below its own size
    with pytest.raises(ValueError, match="padded to 20 and 2"):
        fill(buf, 20, 2)  # beyond the buffers


def test_bucket_choice():
    plan = GraphPlan(sizes=(1, 2, 4, 8, 16, 24), query_lens=(1, 5), stand_in=True)
    assert pick_bucket(plan, 1, 1) == (1, 1)
    assert pick_bucket(plan, 3, 1) == (4, 1)
    assert pick_bucket(plan, 17, 3) == (24, 5)   # any verification of k <= 4 takes 1 + 4
    assert pick_bucket(plan, 24, 5) == (24, 5)
    assert pick_bucket(plan, 25, 1) is None      # above every size: eager
    assert pick_bucket(plan, 2, 6) is None       # a longer chunk (prefill): eager
    assert pick_bucket(plan, 0, 0) is None
    keys = plan.keys()
    assert keys[0] == (24, 5) and keys[-1] == (1, 1) and len(keys) == 12  # largest first
