"""What the API process watches in its engine core: that the core still speaks, and that every
request's reader still reads.

The core sends a message after every step and a heartbeat every `HEARTBEAT_S` while idle, so a
silence means a core that is stopped (`kill -STOP`), hung (a deadlock in a kernel or in OpenMP)
or in an endless step. The limit is the iteration timeout (`--engine-iteration-timeout-s`, or
vLLM's `VLLM_ENGINE_ITERATION_TIMEOUT_S`, 60 s by default) or four times the longest silence seen
while requests were in flight (a step), whichever is longer, and never under three heartbeats: a
machine whose steps are slow (a large prefill chunk on a few cores) is not taken for a hung one
once it has shown its pace.

A reader stalled past `--stream-stall-timeout-s` (an output waiting untaken in its collector:
a client that stopped reading its stream) loses its request: it is aborted and its blocks freed.
`watch` is the loop that checks both, on the API process's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable, Iterable, Optional

from tandem.engine.engine_client import ReaderStalledError
from tandem.engine.output_collector import OutputCollector

logger = logging.getLogger("tandem.engine_client")

HEARTBEAT_S = 1.0               # the core's idle heartbeat
DEFAULT_ITERATION_TIMEOUT_S = 60.0
DEFAULT_STREAM_STALL_TIMEOUT_S = 300.0
_ENV_KEYS = ("TANDEM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_ENGINE_ITERATION_TIMEOUT_S")


def default_iteration_timeout() -> float:
    """The environment's iteration timeout (ours, then vLLM's name), else 60 s."""
    for key in _ENV_KEYS:
        value = os.environ.get(key, "").strip()
        if value:
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"{key} must be a number of seconds, not {value!r}") from None
            if not seconds > 0:
                raise ValueError(f"{key} must be a positive number of seconds, not {value!r}")
            return seconds
    return DEFAULT_ITERATION_TIMEOUT_S


class CoreWatchdog:
    def __init__(self, iteration_timeout_s: float, stream_stall_timeout_s: float) -> None:
        self.iteration_timeout_s = iteration_timeout_s
        self.stream_stall_timeout_s = stream_stall_timeout_s
        self.last_message = time.monotonic()
        self.longest_silence = 0.0
        self._busy = False

    @property
    def check_interval_s(self) -> float:
        return max(0.05, min(1.0, self.iteration_timeout_s / 4, self.stream_stall_timeout_s / 4))

    def heard(self, busy: bool, now: Optional[float] = None) -> None:
        """A message came from the core; `busy`: requests are in flight. A silence counts as a
        step only when requests were in flight at both its ends (not an idle heartbeat's
        period, not the wait before the first request)."""
        now = time.monotonic() if now is None else now
        if busy and self._busy:
            self.longest_silence = max(self.longest_silence, now - self.last_message)
        self.last_message, self._busy = now, busy

    @property
    def silence_limit_s(self) -> float:
        return max(self.iteration_timeout_s, 4 * self.longest_silence, 3 * HEARTBEAT_S)

    def hung(self, now: Optional[float] = None) -> Optional[str]:
        """Why the core counts as hung, or None."""
        now = time.monotonic() if now is None else now
        silent = now - self.last_message
        if silent <= self.silence_limit_s:
            return None
        return (f"the engine core sent nothing for {silent:.0f} s (the limit is "
                f"{self.silence_limit_s:.0f} s: --engine-iteration-timeout-s, or "
                "VLLM_ENGINE_ITERATION_TIMEOUT_S); it is stopped or hung")

    def stalled(self, streams: Iterable[tuple[str, OutputCollector]],
                now: Optional[float] = None) -> list[str]:
        """The requests whose reader took nothing for longer than the stall limit."""
        now = time.monotonic() if now is None else now
        return [request_id for request_id, collector in streams
                if collector.pending_since is not None
                and now - collector.pending_since > self.stream_stall_timeout_s]

    async def watch(self, streams: dict[str, OutputCollector], alive: Callable[[], bool],
                    on_hung: Callable[[str], None], abort: Callable[[str], None]) -> None:
        """Every check interval, while `alive()`: a silent core is reported to `on_hung(why)`
        (once: the watch ends); a stalled reader's request gets a `ReaderStalledError` and is
        `abort`ed."""
        while alive():
            await asyncio.sleep(self.check_interval_s)
            if not alive():
                return
            why = self.hung()
            if why is not None:
                on_hung(why)
                return
            for request_id in self.stalled(streams.items()):
                logger.warning("request %s: its reader took nothing for over %g s "
                               "(--stream-stall-timeout-s); aborting it", request_id,
                               self.stream_stall_timeout_s)
                streams[request_id].put_nowait(ReaderStalledError(
                    "the client read nothing of this stream for over "
                    f"{self.stream_stall_timeout_s:g} s; the request was aborted"))
                abort(request_id)
