"""Where the tensor-parallel ranks of one engine live and how they find each other.

Ranks are laid out node by node: node n runs ranks n * per_node ... (n + 1) * per_node - 1. They
meet through torch.distributed's TCP store at MASTER_ADDR:MASTER_PORT (the standard rendezvous,
as vLLM's multiprocessing backend uses it): gloo carries the collectives on CPU, NCCL on CUDA,
and a second gloo group carries rank 0's commands (it waits without a deadline while idle).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from tandem.distributed.parallel_state import TPGroup

STORE_TIMEOUT = timedelta(seconds=300)       # every rank must have joined by then
COLLECTIVE_TIMEOUT = timedelta(seconds=60)    # a collective waiting this long has lost a peer
COMMAND_TIMEOUT = timedelta(days=365)        # workers wait for commands for as long as it takes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Launch:
    world_size: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @property
    def per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        return range(self.node_rank * self.per_node, (self.node_rank + 1) * self.per_node)

    def with_port(self) -> Launch:
        """A single-node launch without a port gets a free one."""
        if self.master_port:
            return self
        return Launch(self.world_size, self.nnodes, self.node_rank, self.master_addr,
                      free_port())


@dataclass
class Joined:
    group: TPGroup      # the collectives of the model's layers
    commands: Any       # the gloo group rank 0 broadcasts commands on
    store: Any          # the rendezvous store (heartbeats)


def join(rank: int, launch: Launch, device: torch.device) -> Joined:
    """Join the rendezvous as `rank` (rank 0 hosts the store)."""
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process; tandem's "
                           "tensor-parallel executor needs to own it.")
    store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                          is_master=rank == 0, timeout=STORE_TIMEOUT)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=launch.world_size,
                            timeout=COLLECTIVE_TIMEOUT)
    commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    return Joined(TPGroup(rank, launch.world_size, None), commands, store)


def heartbeat_store(launch: Launch) -> Any:
    """A client connection of its own, for a thread beside the collectives."""
    return dist.TCPStore(launch.master_addr, launch.master_port, None, is_master=False,
                         timeout=STORE_TIMEOUT)


def launch_from(tensor_parallel_size: int, nnodes: Optional[int], node_rank: Optional[int],
                master_addr: Optional[str], master_port: Optional[int]) -> Launch:
    """Flags first, then the usual environment variables (MASTER_ADDR, MASTER_PORT, NNODES or
    WORLD_SIZE for the node count, NODE_RANK or RANK for this node's rank)."""
    env = os.environ
    nnodes = nnodes if nnodes is not None else int(env.get("NNODES") or env.get("WORLD_SIZE")
                                                   or 1)
    node_rank = node_rank if node_rank is not None else int(env.get("NODE_RANK")
                                                            or env.get("RANK") or 0)
    addr = master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = master_port if master_port is not None else int(env.get("MASTER_PORT") or 0)
    return Launch(tensor_parallel_size, nnodes, node_rank, addr, port)
