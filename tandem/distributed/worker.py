"""A tensor-parallel worker process: one rank's shard of the target (and of the draft when the
draft is tensor-parallel too), its KV cache shard, and a loop that runs whatever forward rank 0
broadcasts. Scheduling, sampling and everything else stay on rank 0.

Workers are started as `python -m tandem.distributed.worker` with their arguments pickled on
stdin (`start_worker`), not forked or spawned from the caller's `__main__`: a user's script needs
no `if __name__ == "__main__"` guard.
"""

from __future__ import annotations

import logging
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from tandem.distributed.launch import Launch, heartbeat_store, join
from tandem.distributed.parallel_state import SINGLE, TPGroup, building_for
from tandem.engine.process_guard import die_with_parent
from tandem.worker.graph_runner import make_runner
from tandem.worker.kv_cache import allocate_kv_caches, kv_formats

logger = logging.getLogger("tandem")
HEARTBEAT_S = 1.0


def load_models(config: Any, group: TPGroup) -> dict[str, Optional[nn.Module]]:
    """This rank's modules: the target shard; the draft's shard when the draft is tensor-parallel,
    or (on rank 0 only) the whole draft when it runs beside rank 0."""
    from tandem.models.loading import load_model

    with building_for(group):
        models: dict[str, Optional[nn.Module]] = {
            "target": load_model(config.model_config, config.device)}
    spec = config.speculative_config
    models["draft"] = None
    if spec is not None and not spec.model_free:
        draft_group = group if (spec.draft_tensor_parallel_size or 1) > 1 else SINGLE
        if draft_group.size > 1 or group.rank == 0:
            with building_for(draft_group):
                models["draft"] = load_model(spec.draft_model_config, config.device)
    return models


def receive(commands: Any) -> Any:
    box = [None]
    dist.broadcast_object_list(box, src=0, group=commands)
    return box[0]


def _heartbeat(launch: Launch, rank: int, stop: threading.Event) -> None:
    store = heartbeat_store(launch)
    while not stop.is_set():
        store.add(f"tandem/heartbeat/{rank}", 1)
        stop.wait(HEARTBEAT_S)


def worker_main(rank: int, launch: Launch, config: Any, threads: int) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the engine, which stops us
    torch.set_num_threads(threads)
    joined = join(rank, launch, config.device)
    models = load_models(config, joined.group)
    # eager runners (graphs run at one rank), so every rank takes rank 0's path for a batch
    runners = {which: make_runner(config, which, m) for which, m in models.items()
               if m is not None}
    num_blocks = receive(joined.commands)
    formats = kv_formats(config)
    for which, model in models.items():
        if model is not None:
            allocate_kv_caches(model, num_blocks, config.cache_config.block_size,
                               formats[which], config.device)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(launch, rank, stop), daemon=True).start()
    try:
        while True:
            command = receive(joined.commands)
            if command[0] == "stop":
                break
            _, which, batch, rows = command
            runners[which].run(batch, rows)
    finally:
        stop.set()
        time.sleep(0.05)
        dist.destroy_process_group()


def start_worker(rank: int, launch: Launch, config: Any, threads: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tandem.distributed.worker"],
                            stdin=subprocess.PIPE)
    proc.stdin.write(pickle.dumps((rank, launch, config, threads)))
    proc.stdin.close()
    return proc


if __name__ == "__main__":
    worker_main(*pickle.load(sys.stdin.buffer))
