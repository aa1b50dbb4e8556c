"""A node with node rank > 0: it runs its share of the tensor-parallel ranks as worker processes
and nothing else (node 0 hosts the engine, rank 0 and the API). It exits when its workers do:
status 0 once rank 0 told them to stop, 1 if any failed."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from tandem.distributed.worker import start_worker

logger = logging.getLogger("tandem")


def run_worker_node(config: Any) -> int:
    launch = config.parallel_config.launch
    ranks = list(launch.local_ranks)
    threads = max(1, (os.cpu_count() or 1) // len(ranks))
    procs = [start_worker(r, launch, config, threads) for r in ranks]
    logger.info("node %d of %d: tensor-parallel ranks %s, rendezvous at %s:%d", launch.node_rank,
                launch.nnodes, ranks, launch.master_addr, launch.master_port)

    def stop(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return 0 if all(p.wait() == 0 for p in procs) else 1
