"""`ParallelConfig`: how many tensor-parallel ranks, over how many machines, meeting where.

Validated on construction; `launch` gives `distributed/launch.py`'s `Launch` for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.distributed.launch import Launch


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    nnodes: int = 1            # machines the ranks spread over (ranks split evenly)
    node_rank: int = 0         # this machine's place among them; > 0 runs workers only
    master_addr: str = "127.0.0.1"
    master_port: int = 0       # 0: a free port (one machine only)

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {tp}.")
        if self.nnodes < 1 or tp % self.nnodes:
            raise ValueError(f"nnodes={self.nnodes} must be at least 1 and divide "
                             f"tensor_parallel_size={tp} (each node runs the same number of ranks).")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes}).")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("Several nodes need an agreed rendezvous: pass --master-addr and "
                             "--master-port (or MASTER_ADDR and MASTER_PORT) on every node.")

    @property
    def launch(self) -> Launch:
        return Launch(self.tensor_parallel_size, self.nnodes, self.node_rank, self.master_addr,
                      self.master_port)
