"""Requests with structured outputs wait for their grammar off the engine core's loop.

The first request for a grammar compiles it (and the first one of all builds llguidance's view of
the vocabulary, about a second for a large one). In the engine process that would stall every
stream for as long; so such a request is admitted only once a worker thread has the grammar in
the engine's (thread-safe) cache, and the loop keeps stepping meanwhile. In one process the API
compiled it in a worker thread into the same cache before adding the request; here the API's
cache is its own, so the engine process does it again, once per grammar.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

from tandem.engine.core_messages import AddRequest


class GrammarAdmission:
    def __init__(self, grammars: Any) -> None:
        self._grammars = grammars  # the engine's GrammarCompiler, or None without one
        self._pool: Optional[ThreadPoolExecutor] = None
        self._waiting: dict[str, tuple[AddRequest, Future]] = {}  # in arrival order

    def needs_wait(self, msg: AddRequest) -> bool:
        """Whether `msg` must wait for its grammar (it then waits here, see `submit`)."""
        return self._grammars is not None and msg.params.structured_outputs is not None

    def submit(self, msg: AddRequest) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-grammar")
        spec = msg.params.structured_outputs
        self._waiting[msg.request_id] = (msg, self._pool.submit(self._grammars.prototype, spec))

    def abort(self, request_id: str) -> bool:
        """Forget a waiting request; True if it was waiting (it was never admitted)."""
        return self._waiting.pop(request_id, None) is not None

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._waiting

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def ready(self) -> list[tuple[AddRequest, Optional[BaseException]]]:
        """The waiting requests whose grammar is compiled (None: the engine's add_request finds
        it cached) or failed (the compiler's error, a ValueError for a bad grammar), in arrival
        order."""
        done = [rid for rid, (_, future) in self._waiting.items() if future.done()]
        out = []
        for rid in done:
            msg, future = self._waiting.pop(rid)
            out.append((msg, future.exception()))
        return out

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
