"""EngineCoreClient: the API process's side of the engine core process, with the interface of
`AsyncLLMEngine`, so `entrypoints/` does not know where the engine runs.

`launch` starts `python -m tandem.engine.core_process` (`core_launch.py`), sends it the
configuration and waits for `Ready`. `start`, on the server's event loop, then reads the channel
through an asyncio protocol: no thread, and each message (one per engine step) is decoded and
dispatched by the loop as soon as it is readable. Requests and aborts are written through the
same transport, which never blocks the loop.

Tokenization, chat templates, grammar checks and the HTTP edge stay here; detokenization and
stop strings stay in the engine core, where the scheduler checks a stop string after each token,
so a request stops exactly where it would offline. The engine's outputs come back as deltas
(`output_deltas`), rebuilt here into the same cumulative `RequestOutput`s.

Each request's outputs go to its `OutputCollector`, one slot holding a builder of the newest
snapshot: a reader that lags or stops costs no copies and holds only its own output.

If the engine process dies, says it cannot go on, or falls silent past the watchdog's limit
(`core_watchdog.py`: stopped or hung), every request in flight ends with `EngineDeadError` (a
503), /health turns 503, the process is killed, and `on_dead` is called (the server exits 1). A
request whose reader stalls past the stall limit is aborted alone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import subprocess
from typing import Any, Callable, Optional, Union

from tandem.engine.core_launch import spawn_core_process, stop_process, wait_ready
from tandem.engine.core_messages import (AbortRequests, AddRequest, EngineCoreOutputs,
                                         FrameBuffer, Ready, Shutdown, UtilityCall, encode_frame)
from tandem.engine.core_watchdog import (DEFAULT_STREAM_STALL_TIMEOUT_S, CoreWatchdog,
                                         default_iteration_timeout)
from tandem.engine.engine_client import EngineClient, EngineDeadError, EngineStepError
from tandem.engine.output_collector import OutputCollector
from tandem.engine.output_deltas import OutputAssembler
from tandem.logprob_rows import TokenTexts
from tandem.metrics import AnyMetric, with_vllm_names
from tandem.sampling_params import SamplingParams

logger = logging.getLogger("tandem.engine_client")


class _ChannelProtocol(asyncio.Protocol):
    def __init__(self, client: EngineCoreClient) -> None:
        self.client = client
        self.frames = FrameBuffer()

    def data_received(self, data: bytes) -> None:
        for message in self.frames.feed(data):
            self.client._on_message(message)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.client._on_channel_closed()


class EngineCoreClient(EngineClient):
    def __init__(self, sock: socket.socket, ready: Ready, tokenizer: Any, max_model_len: int,
                 vocab_size: int, sampling_defaults: dict, grammars: Any = None,
                 process: Optional[subprocess.Popen] = None,
                 iteration_timeout_s: Optional[float] = None,
                 stream_stall_timeout_s: float = DEFAULT_STREAM_STALL_TIMEOUT_S) -> None:
        self._sock = sock
        self.process = process
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.sampling_defaults = dict(sampling_defaults)
        self.grammars = grammars  # thread-safe: the server checks grammars in worker threads
        self.num_blocks = ready.num_blocks
        self.accepting = True  # False while shutting down: new requests get a 503
        self.on_dead: Optional[Callable[[], None]] = None
        self._metrics: list = list(ready.metrics)
        self._streams: dict[str, OutputCollector] = {}
        self._adds: dict[str, asyncio.Future] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._assembler = OutputAssembler(None if tokenizer is None else TokenTexts(tokenizer))
        self._aborts: list[str] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._transport: Optional[asyncio.Transport] = None
        self._dead: Optional[str] = None
        self._closing = False
        self.watchdog = CoreWatchdog(iteration_timeout_s or default_iteration_timeout(),
                                     stream_stall_timeout_s)
        self._watch_task: Optional[asyncio.Task] = None

    # ---- start-up ----------------------------------------------------------------------------

    @classmethod
    def launch(cls, config: Any, log_stats: bool,
               load_frontend: Callable[[], tuple[Any, dict, Any]],
               iteration_timeout_s: Optional[float] = None,
               stream_stall_timeout_s: float = DEFAULT_STREAM_STALL_TIMEOUT_S
               ) -> EngineCoreClient:
        """Start the engine core process and wait until it serves; raises EngineStartupError.
        `load_frontend` gives (tokenizer, sampling defaults, grammar cache) for this process: it
        is called while the engine process loads, which it overlaps."""
        iteration_timeout_s = iteration_timeout_s or default_iteration_timeout()  # checked first
        ours, process = spawn_core_process(config, log_stats)
        try:
            tokenizer, sampling_defaults, grammars = load_frontend()
            ready = wait_ready(ours, process)
        except BaseException:
            ours.close()
            stop_process(process, 5.0)
            raise
        mc = config.model_config
        return cls(ours, ready, tokenizer, mc.max_model_len, mc.vocab_size, sampling_defaults,
                   grammars, process, iteration_timeout_s, stream_stall_timeout_s)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        transport, _ = await self._loop.connect_accepted_socket(
            lambda: _ChannelProtocol(self), self._sock)
        self._transport = transport  # type: ignore[assignment]
        self.watchdog.heard(busy=False)  # the silence counts from now, not from the start-up
        self._watch_task = self._loop.create_task(self.watchdog.watch(
            self._streams, lambda: self._dead is None and not self._closing, self._hung,
            self.abort_nowait))

    # ---- the interface of AsyncLLMEngine ----------------------------------------------------

    @property
    def is_running(self) -> bool:
        return (self._dead is None and not self._closing
                and (self.process is None or self.process.poll() is None))

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine is not running: {self._dead}")
        if not self.is_running:
            raise EngineDeadError("the engine is not running")

    async def add_request(self, request_id: str, prompt: Union[str, list[int]],
                          params: SamplingParams, final_only: bool = False) -> OutputCollector:
        self._check_alive()
        if not self.accepting:
            raise EngineDeadError("the server is shutting down")
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id!r}")
        assert self._loop is not None, "EngineCoreClient.start() was not awaited"
        stream = OutputCollector()
        added = self._loop.create_future()
        self._streams[request_id] = stream
        self._adds[request_id] = added
        self._assembler.add(request_id, prompt)
        self._send(AddRequest(request_id, prompt, params, final_only))
        try:
            await added
        except asyncio.CancelledError:
            # The caller gave up (a client timeout): the abort follows the add on the channel.
            self.abort_nowait(request_id)
            raise
        except BaseException:
            self._forget(request_id)
            raise
        return stream

    def abort_nowait(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is None:
            return  # finished, failed or aborted already
        self._assembler.forget(request_id)
        added = self._adds.pop(request_id, None)
        if added is not None and not added.done():
            added.cancel()  # its caller is not waiting for it any more
        if self._dead is not None or self._loop is None:
            return
        if not self._aborts:  # one message for every abort of this turn of the loop
            self._loop.call_soon_threadsafe(self._flush_aborts)
        self._aborts.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.abort_nowait(request_id)

    def metrics_snapshot(self) -> list[AnyMetric]:
        return self._metrics

    async def get_metrics(self) -> list[AnyMetric]:
        """Fresh metrics, read by the engine between two steps."""
        return with_vllm_names(await self._call("get_metrics"))

    async def num_free_kv_blocks(self) -> int:
        return await self._call("num_free_kv_blocks")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Tell the engine process to stop, and wait for it (then kill it)."""
        if self._closing:
            return
        self._closing = True
        live = (self._transport is not None and self._loop is not None
                and not self._loop.is_closed())
        try:
            if live and self._transport.get_write_buffer_size() == 0:
                self._transport.write(encode_frame(Shutdown()))  # written at once: buffer empty
            else:  # bytes still buffered, or no loop left: a closed channel says the same
                self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the process is gone already
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self.process is not None:
            stop_process(self.process, timeout)
        if live:
            self._transport.close()
        else:
            self._sock.close()

    # ---- the channel -------------------------------------------------------------------------

    def _send(self, message: Any) -> None:
        if self._transport is None or self._transport.is_closing():
            raise EngineDeadError("the engine channel is closed")
        self._transport.write(encode_frame(message))

    def _flush_aborts(self) -> None:
        ids, self._aborts = self._aborts, []
        if ids and self._dead is None and not self._closing:
            try:
                self._send(AbortRequests(ids))
            except EngineDeadError:
                pass  # the engine is gone, and its requests with it

    async def _call(self, method: str) -> Any:
        self._check_alive()
        assert self._loop is not None, "EngineCoreClient.start() was not awaited"
        call_id = next(self._call_ids)
        result = self._loop.create_future()
        self._calls[call_id] = result
        self._send(UtilityCall(call_id, method))
        try:
            return await result
        finally:
            self._calls.pop(call_id, None)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._adds.pop(request_id, None)
        self._assembler.forget(request_id)

    def _on_message(self, msg: EngineCoreOutputs) -> None:
        self.watchdog.heard(busy=bool(self._streams))
        if msg.metrics is not None:  # before the outputs: a finished request is counted
            self._metrics = msg.metrics
        for a in msg.added:
            added = self._adds.pop(a.request_id, None)
            if added is None or added.done():
                continue  # its caller gave up; the abort is on its way
            if a.error_type is None:
                added.set_result(None)
            else:
                self._forget(a.request_id)
                added.set_exception(ValueError(a.error) if a.error_type == "ValueError"
                                    else RuntimeError(f"{a.error_type}: {a.error}"))
        for d in msg.outputs:
            stream = self._streams.get(d.request_id)
            if stream is None:
                continue  # aborted while the step ran
            if d.error:
                self._forget(d.request_id)
                stream.put_nowait(EngineStepError(f"internal engine error: {d.error}"))
                continue
            build = self._assembler.apply_lazily(d)  # built only if its reader takes it
            if d.finished:
                self._streams.pop(d.request_id, None)  # forgotten before its caller sees the end
            stream.put_nowait(build)
        for u in msg.utility:
            result = self._calls.get(u.call_id)
            if result is not None and not result.done():
                if u.error is None:
                    result.set_result(u.result)
                else:
                    result.set_exception(RuntimeError(u.error))
        if msg.dead:
            self._die(msg.dead)

    def _hung(self, reason: str) -> None:
        self._die(reason)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # a stopped process cannot exit by itself

    def _on_channel_closed(self) -> None:
        if self._closing:
            return
        code = None
        if self.process is not None:
            try:  # a killed process is reaped at once; give an exiting one a moment
                code = self.process.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        self._die("the engine core process exited" +
                  (f" with status {code}" if code is not None else ""))

    def _die(self, reason: str) -> None:
        if self._dead is not None:
            return
        self._dead = reason
        self.accepting = False
        logger.critical("the engine core died: %s", reason)
        error = EngineDeadError(f"the engine is not running: {reason}")
        for request_id, stream in list(self._streams.items()):
            stream.put_nowait(error)
        self._streams.clear()
        for future in [*self._adds.values(), *self._calls.values()]:
            if not future.done():
                future.set_exception(error)
        self._adds.clear()
        if self.on_dead is not None:
            self.on_dead()
