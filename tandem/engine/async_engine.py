"""AsyncLLMEngine: drives the (not thread-safe) LLMEngine from one background thread for asyncio
callers such as the OpenAI server.

The thread owns the engine: it takes commands from an inbox (add, abort, call), a bounded number
between steps so a burst of admissions never stalls generation, runs `step()` while there is
work, and hands each request's outputs to that request's `OutputCollector` through
`loop.call_soon_threadsafe`. Everything that touches the engine runs on that thread. After every
step it publishes a metrics snapshot, which `/metrics` reads without waiting for the thread.

No client can stop the loop: a request that fails is failed alone (by the engine, or here), a
caller that gives up mid-admission has its request aborted, and any command that raises is
logged. Should the loop itself ever die, `on_dead` is called (the server then exits non-zero).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from tandem.distributed.errors import WorkerDiedError
from tandem.engine.engine_metrics import stats_line
from tandem.engine.engine_client import EngineClient, EngineDeadError, EngineStepError
from tandem.engine.output_collector import OutputCollector
from tandem.metrics import with_vllm_names
from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams

logger = logging.getLogger("tandem.async_engine")

_IDLE_WAIT_S = 0.05  # how long the thread blocks on an empty inbox before checking for shutdown
_COMMANDS_PER_STEP = 64  # commands handled between two steps while generating


@dataclass
class _Add:
    request_id: str
    prompt: Union[str, list[int]]
    params: SamplingParams
    stream: OutputCollector
    loop: asyncio.AbstractEventLoop
    final_only: bool = False
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class AsyncLLMEngine(EngineClient):
    def __init__(self, engine: Any, log_stats: bool = False, log_interval_s: float = 10.0,
                 on_dead: Optional[Callable[[], None]] = None) -> None:
        self.engine = engine
        # Read-only after construction, so safe to use from the event loop.
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.model_config.max_model_len
        self.vocab_size: int = engine.model_config.vocab_size
        # Thread-safe, so the server compiles grammars in worker threads, off the engine's loop.
        self.grammars = getattr(engine, "grammars", None)
        self.sampling_defaults: dict = dict(getattr(engine, "sampling_defaults", {}) or {})
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputCollector]] = {}
        self._stop = threading.Event()
        self._log_stats = log_stats
        self._log_interval_s = log_interval_s
        self.on_dead = on_dead
        self.accepting = True  # False while shutting down: new requests get a 503
        self._metrics: list = self._safe_metrics()
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_kwargs(cls, log_stats: bool = False, **kwargs: Any) -> AsyncLLMEngine:
        from tandem.engine.llm_engine import LLMEngine
        return cls(LLMEngine.from_kwargs(disable_log_stats=not log_stats, **kwargs),
                   log_stats=log_stats)

    # ---- event-loop side -------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def _check_alive(self) -> None:
        if not self.is_running:
            raise EngineDeadError("the engine loop is not running")

    async def add_request(self, request_id: str, prompt: Union[str, list[int]],
                          params: SamplingParams, final_only: bool = False) -> OutputCollector:
        """Queue a request; raises what engine.add_request raises (ValueError for bad input)."""
        self._check_alive()
        if not self.accepting:
            raise EngineDeadError("the server is shutting down")
        loop = asyncio.get_running_loop()
        cmd = _Add(request_id, prompt, params, OutputCollector(), loop, final_only)
        self._inbox.put(cmd)
        try:
            await asyncio.wrap_future(cmd.done)
        except asyncio.CancelledError:
            # The caller gave up (a client timeout). If the engine thread already added the
            # request, nobody will read it: abort it (the inbox keeps the order add, abort).
            self.abort_nowait(request_id)
            raise
        return cmd.stream

    def abort_nowait(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    async def abort(self, request_id: str) -> None:
        self.abort_nowait(request_id)
        await self.call(lambda _engine: None)  # returns once the abort has been applied

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the engine thread between steps (e.g. reading metrics)."""
        self._check_alive()
        cmd = _Call(fn)
        self._inbox.put(cmd)
        return await asyncio.wrap_future(cmd.done)

    async def get_metrics(self) -> list:
        return await self.call(lambda engine: with_vllm_names(engine.get_metrics()))

    def metrics_snapshot(self) -> list:
        """The metrics as of the last step (no wait for the engine thread)."""
        return self._metrics

    async def num_free_kv_blocks(self) -> Optional[int]:
        return await self.call(lambda engine: engine.num_free_kv_blocks()
                               if hasattr(engine, "num_free_kv_blocks") else None)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        stop = getattr(self.engine, "shutdown", None)
        if stop is not None:
            stop()  # worker processes of a tensor-parallel engine

    # ---- engine-thread side ----------------------------------------------------------------

    def _deliver(self, request_id: str, item: Union[RequestOutput, BaseException],
                 last: bool = False) -> None:
        # Forget a finished request before its caller can observe the end.
        target = self._streams.pop(request_id, None) if last else self._streams.get(request_id)
        if target is None:
            return
        loop, stream = target
        try:
            loop.call_soon_threadsafe(stream.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed; nobody is listening
            self._streams.pop(request_id, None)

    def _handle(self, cmd: Union[_Add, _Abort, _Call]) -> None:
        if isinstance(cmd, _Add):
            if not cmd.done.set_running_or_notify_cancel():
                return  # the caller gave up before the request was added
            if cmd.request_id in self._streams:
                cmd.done.set_exception(ValueError(f"duplicate request id {cmd.request_id!r}"))
                return
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params,
                                        final_only=cmd.final_only)
            except Exception as e:  # ValueError for bad input; anything else still goes back
                cmd.done.set_exception(e)
                return
            self._streams[cmd.request_id] = (cmd.loop, cmd.stream)
            cmd.done.set_result(None)
        elif isinstance(cmd, _Abort):
            if self._streams.pop(cmd.request_id, None) is not None:
                try:
                    self.engine.abort_request(cmd.request_id)
                except Exception:
                    logger.exception("abort_request(%s) failed", cmd.request_id)
        elif cmd.done.set_running_or_notify_cancel():
            try:
                cmd.done.set_result(cmd.fn(self.engine))
            except Exception as e:
                cmd.done.set_exception(e)

    def _handle_safely(self, cmd: Union[_Add, _Abort, _Call]) -> None:
        try:
            self._handle(cmd)
        except Exception:  # a command must never take the loop down
            logger.exception("engine command %s failed", type(cmd).__name__)

    def _fail_all(self, error: BaseException) -> None:
        """After step() itself raised (the engine isolates request failures, so this is a bug),
        fail every request in flight and drop it from the engine, so the next requests start
        from a clean scheduler."""
        failed = EngineStepError(f"internal engine error: {type(error).__name__}: {error}")
        for request_id in list(self._streams):
            self._deliver(request_id, failed, last=True)
            try:
                self.engine.abort_request(request_id)
            except Exception:
                logger.exception("abort_request(%s) failed after a step error", request_id)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # noqa: BLE001 - the loop is gone; say so and let the owner exit
            logger.critical("the engine loop died", exc_info=True)
            stop = getattr(self.engine, "shutdown", None)
            if stop is not None:
                try:
                    stop()
                except Exception:  # noqa: BLE001 - already dying; leave no workers behind
                    logger.exception("shutting down the engine failed")
            self._stop.set()
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError("the engine loop died"), last=True)
            if self.on_dead is not None:
                self.on_dead()

    def _loop(self) -> None:
        last_log = time.monotonic()
        while not self._stop.is_set():
            failure = getattr(self.engine, "failure", None)
            if failure:  # a tensor-parallel worker died: the engine cannot go on
                raise WorkerDiedError(failure)
            busy = bool(self._streams) and self._has_work()
            try:
                cmd = self._inbox.get(block=not busy, timeout=None if busy else _IDLE_WAIT_S)
                self._handle_safely(cmd)
                for _ in range(_COMMANDS_PER_STEP - 1 if busy else 10**9):
                    self._handle_safely(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if not self._has_work():
                self._metrics = self._safe_metrics()
                continue
            try:
                for out in self.engine.step():
                    if out.request_id not in self._streams:
                        continue  # aborted while the step ran
                    if getattr(out, "error", None):
                        self._deliver(out.request_id, EngineStepError(
                            f"internal engine error: {out.error}"), last=True)
                        continue
                    # The engine hands out fresh lists and stats copies each step, so the event loop
                    # can read `out` while this thread keeps stepping.
                    self._deliver(out.request_id, out, last=out.finished)
            except WorkerDiedError:
                raise
            except Exception as e:  # the loop must outlive any one bad step
                logger.exception("engine step failed; failing %d request(s)", len(self._streams))
                self._fail_all(e)
            self._metrics = self._safe_metrics()
            if self._log_stats and time.monotonic() - last_log > self._log_interval_s:
                last_log = time.monotonic()
                logger.info(stats_line(self._metrics, len(self._streams)))

    def _safe_metrics(self) -> list:
        try:
            return list(self.engine.get_metrics())
        except Exception:
            logger.exception("get_metrics failed")
            return []

    def _has_work(self) -> bool:
        try:
            return bool(self.engine.has_unfinished_requests())
        except Exception:
            logger.exception("has_unfinished_requests failed")
            return False
