"""What the server sees of an engine, whichever way it runs: in a thread of this process
(`AsyncLLMEngine`) or in a process of its own (`EngineCoreClient`). Both add requests, hand each
its `OutputCollector` of cumulative outputs (one slot: the newest wins), abort, and publish a
metrics snapshot; the reading of a request's collector and the errors a request can end with are
shared here.
"""

from __future__ import annotations

import abc
from typing import Any, AsyncIterator, Callable, Optional, Union

from tandem.engine.output_collector import OutputCollector
from tandem.metrics import AnyMetric
from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams


class EngineStepError(RuntimeError):
    """A request failed inside the engine (an HTTP 500 for that request only)."""


class EngineDeadError(RuntimeError):
    """The engine is not running (it died, or the server is shutting down)."""


class ReaderStalledError(RuntimeError):
    """The request's reader took nothing for longer than the server's limit: it was aborted."""


class EngineClient(abc.ABC):
    """What the server uses of an engine. Read-only after construction: the tokenizer, the
    limits and the sampling defaults (safe to use from the event loop), and `grammars`, a
    thread-safe grammar cache for checking structured-output requests in worker threads (or
    None). `accepting` turns False when the server starts shutting down (new requests: 503);
    `on_dead` is called once should the engine die."""

    tokenizer: Any
    max_model_len: int
    vocab_size: int
    sampling_defaults: dict
    grammars: Any
    accepting: bool
    on_dead: Optional[Callable[[], None]]

    @property
    @abc.abstractmethod
    def is_running(self) -> bool:
        """False once the engine died or was shut down."""

    @property
    @abc.abstractmethod
    def num_in_flight(self) -> int:
        """Requests added and not yet finished, failed or aborted."""

    @abc.abstractmethod
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the engine (and any worker processes)."""

    @abc.abstractmethod
    async def add_request(self, request_id: str, prompt: Union[str, list[int]],
                          params: SamplingParams, final_only: bool = False) -> OutputCollector:
        """Queue a request; raises ValueError for bad input, EngineDeadError when the engine
        is not running. `final_only`: one output, when the request has finished (a response
        that is not streamed needs no other, and the engine builds none)."""

    @abc.abstractmethod
    def abort_nowait(self, request_id: str) -> None:
        """Abort a request (unknown or finished ones are ignored by the engine)."""

    async def generate(self, prompt: Union[str, list[int]], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yield cumulative RequestOutputs until the request finishes. Leaving early (break,
        cancellation, client disconnect) aborts the request so its KV blocks are freed."""
        stream = await self.add_request(request_id, prompt, params)
        outputs = self.iterate(request_id, stream)
        try:
            async for out in outputs:
                yield out
        finally:
            await outputs.aclose()  # runs iterate's abort now, not when garbage-collected

    async def iterate(self, request_id: str, stream: OutputCollector
                      ) -> AsyncIterator[RequestOutput]:
        """The outputs of a request added with add_request (split out so a caller can add several
        requests, and report a bad one, before streaming any). A reader that lags sees only the
        newest output: they are cumulative."""
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort_nowait(request_id)

    async def start(self) -> None:
        """Called on the server's event loop before it serves (the process client binds its
        channel to that loop; the thread engine is already running)."""

    @abc.abstractmethod
    def metrics_snapshot(self) -> list[AnyMetric]:
        """The engine's metrics as last published (no wait for the engine)."""
