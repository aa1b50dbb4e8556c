"""Helpers for the reliability tests: metrics scraping, latency probes, an in-process server over
a real engine (for fault injection), and the figures the suite reports in pytest's summary."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import httpx

# "what was measured" -> text; printed at the end of the session (see conftest.py).
RELIABILITY: dict[str, str] = {}
# One KV block of the tiny llama and its draft (2 layers x 2 KV heads x head_dim 16 x K and V x
# 2 bytes, the CPU's default float16 cache, x 16 slots, each model); the reliability server's
# REL_BLOCKS of them cannot hold 16 requests at once, so load forces preemption.
TINY_BLOCK_BYTES = 2 * (2 * 2 * 16 * 2 * 2 * 16)
REL_BLOCKS = 24


def metric(url: str, name: str) -> float:
    """The value of an unlabelled-by-us series `name{model_name=...}` in /metrics."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics")


def wait_idle(url: str, total_blocks: int, timeout: float = 20.0) -> None:
    """Until no request runs or waits and every KV block is free again."""
    deadline = time.monotonic() + timeout
    while True:
        running = metric(url, "tandem:num_requests_running")
        waiting = metric(url, "tandem:num_requests_waiting")
        free = metric(url, "tandem:kv_cache_free_blocks")
        if running == waiting == 0 and free == total_blocks:
            return
        assert time.monotonic() < deadline, (
            f"not idle after {timeout}s: running {running}, waiting {waiting}, free blocks "
            f"{free} of {total_blocks}")
        time.sleep(0.05)


# The probe runs in a process of its own, with nothing but httpx loaded: polled from the test's
# process, its timings also held the waits for that process's GIL (16 threads reading streams)
# and its full garbage collections (pytest, torch and transformers loaded), which are the test's
# and not the server's.
_PROBE = """
import json, sys, threading, time, httpx
url, interval = sys.argv[1], float(sys.argv[2])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
latencies, statuses = [], []
with httpx.Client(timeout=30) as client:
    client.get(url)  # the connection is made before timing starts
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        r = client.get(url)
        latencies.append(time.perf_counter() - t0)
        statuses.append(r.status_code)
        time.sleep(interval)
print(json.dumps([latencies, statuses]), flush=True)
"""


class LatencyProbe:
    """Polls GET `path` every `interval` seconds, from its own process, between `__enter__` (which
    returns once the probe is connected) and `__exit__`; `worst` is the slowest answer."""

    def __init__(self, url: str, path: str, interval: float = 0.02) -> None:
        self.latencies: list[float] = []
        self.statuses: list[int] = []
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, url + path, str(interval)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> LatencyProbe:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        assert line.strip() == "ready", f"the latency probe did not start: {line!r}"
        return self

    def __exit__(self, *exc: Any) -> None:
        out, _ = self._proc.communicate(input="", timeout=60)
        self.latencies, self.statuses = json.loads(out.strip().splitlines()[-1])

    @property
    def worst(self) -> float:
        return max(self.latencies) if self.latencies else float("inf")


@dataclass
class InProcessEngineServer:
    url: str
    engine: Any        # the AsyncLLMEngine
    llm_engine: Any    # the LLMEngine inside it
    stop: Callable[[], None]


def serve_in_process(llm_engine: Any, name: str = "tiny") -> InProcessEngineServer:
    """uvicorn on a free loopback port, in a thread, over `llm_engine` (a real LLMEngine)."""
    import uvicorn

    from entrypoints.server_helpers import free_port
    from tandem.engine.async_engine import AsyncLLMEngine
    from tandem.entrypoints.openai.api_server import build_app

    engine = AsyncLLMEngine(llm_engine)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine, [name]), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "in-process server did not start"
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)
        engine.shutdown()

    return InProcessEngineServer(f"http://127.0.0.1:{port}", engine, llm_engine, stop)


def post(url: str, path: str, body: Any, timeout: float = 30.0,
         headers: Optional[dict] = None) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout, headers=headers)
