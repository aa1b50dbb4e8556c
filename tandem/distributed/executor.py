"""Executors: what runs the models' forward passes for the engine.

`LocalExecutor` (tensor_parallel_size 1) holds the models in this process. `MultiprocExecutor`
holds rank 0's shards here and starts the other ranks as worker processes (or finds them on other
nodes through the rendezvous); every forward is broadcast to them first, so all ranks compute the
same batch in lockstep, and rank 0 receives the full logits. A monitor notices a worker that dies
(its process ends, or its heartbeats stop) within seconds; from then on every forward raises
WorkerDiedError, which the engine does not survive.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from tandem.distributed.errors import WorkerDiedError
from tandem.distributed.launch import Launch, heartbeat_store, join
from tandem.distributed.parallel_state import SINGLE
from tandem.distributed.worker import HEARTBEAT_S, load_models, start_worker
from tandem.worker.graph_runner import GraphRunner, make_runner
from tandem.worker.kv_cache import allocate_kv_caches, kv_formats
from tandem.worker.model_runner import ForwardBatch

logger = logging.getLogger("tandem")
ModelForward = Callable[[ForwardBatch, torch.Tensor], torch.Tensor]
DEAD_AFTER_S = 5.0  # heartbeats missing this long mean the worker is gone


class LocalExecutor:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.models: dict[str, Optional[nn.Module]] = load_models(config, SINGLE)
        self.runners = runners_for(config, self.models)
        self.failure: Optional[str] = None

    def allocate_kv(self, num_blocks: int) -> None:
        """Bind every model's KV caches, then capture the target's CUDA graphs, which hold the
        caches' addresses (graph_runner.py; nothing is captured without a plan)."""
        formats = kv_formats(self.config)
        for which, model in self.models.items():
            if model is not None:
                allocate_kv_caches(model, num_blocks, self.config.cache_config.block_size,
                                   formats[which], self.config.device)
        for runner in self.runners.values():
            runner.capture()

    def forward(self, which: str) -> ModelForward:
        return self.runners[which].run

    def shutdown(self) -> None:
        pass


class MultiprocExecutor(LocalExecutor):
    def __init__(self, config: Any, launch: Launch) -> None:
        self.config, self.launch = config, launch
        local = list(launch.local_ranks)
        threads = max(1, (os.cpu_count() or 1) // len(local))
        self.procs = {r: start_worker(r, launch, config, threads) for r in local[1:]}
        self._stop = threading.Event()
        # Rank 0 shares this process's cores with the workers (restored on shutdown).
        self._state: dict[str, Any] = {"commands": None, "failure": None,
                                       "threads": torch.get_num_threads()}
        # Runs once: on shutdown(), when the executor is collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self._state, self._stop)
        torch.set_num_threads(threads)
        self.joined = join(0, launch, config.device)
        self._state["commands"] = self.joined.commands
        self.models = load_models(config, self.joined.group)
        self.runners = runners_for(config, self.models)
        self.draft_parallel = (config.speculative_config is not None and
                               (config.speculative_config.draft_tensor_parallel_size or 1) > 1)
        # The monitor holds no reference to the executor, which can then be collected.
        threading.Thread(target=_monitor, args=(self.procs, launch, self._state, self._stop),
                         name="tandem-tp-monitor", daemon=True).start()

    @property
    def failure(self) -> Optional[str]:  # type: ignore[override]
        return self._state["failure"]

    def allocate_kv(self, num_blocks: int) -> None:
        self._send(num_blocks)
        super().allocate_kv(num_blocks)

    def forward(self, which: str) -> ModelForward:
        runner = self.runners[which]
        if which == "draft" and not self.draft_parallel:
            return runner.run

        def run(batch: ForwardBatch, rows: torch.Tensor) -> torch.Tensor:
            self._send(("forward", which, batch, rows))
            try:
                return runner.run(batch, rows)
            except Exception as e:  # the other ranks are now in another collective, or gone
                self._fail(f"a tensor-parallel forward failed on rank 0: {type(e).__name__}: {e}")
                raise WorkerDiedError(self.failure) from e

        return run

    def _send(self, command: Any) -> None:
        self._check()
        try:
            dist.broadcast_object_list([command], src=0, group=self.joined.commands)
        except RuntimeError as e:  # gloo reports a vanished peer as a RuntimeError
            time.sleep(HEARTBEAT_S * 1.5)  # let the monitor name the worker that is gone
            if self.failure is None:
                self._fail(f"a tensor-parallel worker is unreachable: {e}")
            raise WorkerDiedError(self.failure) from e

    def _check(self) -> None:
        if self.failure is not None:
            raise WorkerDiedError(self.failure)

    def _fail(self, message: str) -> None:
        _fail(self._state, message)

    def shutdown(self) -> None:
        self._finalizer()


def _fail(state: dict[str, Any], message: str) -> None:
    if state["failure"] is None:
        logger.error("%s; the engine cannot continue", message)
        state["failure"] = message


def _monitor(procs: dict[int, Any], launch: Launch, state: dict[str, Any],
             stop: threading.Event) -> None:
    """Local workers: their processes; every worker: its heartbeat counter in the store."""
    store = heartbeat_store(launch)
    seen: dict[int, tuple[int, float]] = {}
    while not stop.wait(HEARTBEAT_S):
        now = time.monotonic()
        for rank in range(1, launch.world_size):
            proc = procs.get(rank)
            if proc is not None and proc.poll() is not None:
                _fail(state, f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with "
                             f"status {proc.returncode}")
                return
            beats = int(store.add(f"tandem/heartbeat/{rank}", 0))
            last, since = seen.get(rank, (-1, now))
            if beats != last:
                seen[rank] = (beats, now)
            elif now - since > DEAD_AFTER_S and beats > 0:
                _fail(state, f"tensor-parallel worker rank {rank} stopped answering (no heartbeat "
                             f"for {now - since:.0f} s)")
                return


def _shutdown(procs: dict[int, Any], state: dict[str, Any], stop: threading.Event) -> None:
    """Tell the workers to stop, wait briefly, make sure none is left, leave the group."""
    stop.set()
    if state["commands"] is not None and state["failure"] is None and dist.is_initialized():
        try:
            dist.broadcast_object_list([("stop",)], src=0, group=state["commands"])
        except RuntimeError:
            pass
    deadline = time.monotonic() + 5
    for p in procs.values():
        try:
            p.wait(max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.set_num_threads(state["threads"])


def runners_for(config: Any, models: dict[str, Optional[nn.Module]]) -> dict[str, GraphRunner]:
    """Each loaded model's runner (its forward for the engine: eager or graphed)."""
    return {which: make_runner(config, which, m) for which, m in models.items() if m is not None}


def make_executor(config: Any) -> LocalExecutor:
    parallel = config.parallel_config
    if parallel.tensor_parallel_size == 1:
        return LocalExecutor(config)
    return MultiprocExecutor(config, parallel.launch.with_port())
