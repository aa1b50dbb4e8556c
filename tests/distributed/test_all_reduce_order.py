"""TPGroup.all_reduce sums each element in rank order at any number of ranks, so a row's bits do
not follow the size of the tensor it travels in (a ring all-reduce over three or more ranks
starts each chunk's sum at another rank, and the chunks follow the tensor's size)."""

from __future__ import annotations

import subprocess
import sys

import torch
import torch.distributed as dist

from tandem.distributed.parallel_state import TPGroup

RANKS = 3


def _rows(rank: int) -> torch.Tensor:
    """Rank `rank`'s part: [700, 96] of magnitudes 1e-3 to 1e3, so the order of a sum shows."""
    g = torch.Generator().manual_seed(rank)
    return torch.randn(700, 96, generator=g) * 10.0 ** torch.randint(-3, 4, (700, 1), generator=g)


def _worker(rank: int, init: str, out: str) -> None:
    """One rank (a process of its own, started by the test as this file's main)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=RANKS)
    group = TPGroup(rank=rank, size=RANKS)
    rows = _rows(rank)
    alone = [group.all_reduce(rows[i:i + 1].clone()) for i in (0, 350, 699)]
    batched = group.all_reduce(rows.clone())
    every_other = group.all_reduce(rows[::2].clone())
    if rank == 0:
        torch.save({"alone": alone, "batched": batched, "every_other": every_other}, out)
    dist.destroy_process_group()


def test_a_rows_sum_does_not_depend_on_the_tensor_around_it(tmp_path):
    out = tmp_path / "out.pt"
    # Plain subprocesses, waited for: no helper process outlives the test (multiprocessing's
    # resource tracker would, and the tensor-parallel tests count this process's children).
    ranks = [subprocess.Popen([sys.executable, __file__, str(rank),
                               f"file://{tmp_path / 'store'}", str(out)])
             for rank in range(RANKS)]
    assert [r.wait(timeout=120) for r in ranks] == [0] * RANKS
    got = torch.load(out)
    in_order = _rows(0).clone()
    for rank in range(1, RANKS):
        in_order += _rows(rank)
    assert torch.equal(got["batched"], in_order)
    for row, alone in zip((0, 350, 699), got["alone"]):
        assert torch.equal(alone[0], in_order[row]), row
    assert torch.equal(got["every_other"], in_order[::2])


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
