"""One request's outputs on the server side: a single slot, not a queue.

A request's outputs are cumulative, so a reader that falls behind needs only the newest one. The
engine side `put`s after every step; the slot keeps the newest item and drops what it replaces,
so a reader that stops (a client that no longer reads its stream, a writer blocked by flow
control) holds at most one output, never one per step. An item may be a zero-argument builder:
it is called when the reader takes it, so a snapshot nobody reads is never built (the engine
process's client passes its assembler's state this way). An exception is final: nothing replaces
it, and the reader gets it after the output it has not yet taken is dropped.

`pending_since` says since when an item has waited for its reader (None when the slot is empty),
which is how the server finds readers stalled past its limit. `listener`, when set, is an
`asyncio.Event` set on every put, so one task can wait for any of several collectors.
All methods run on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional, Union

from tandem.outputs import RequestOutput

Item = Union[RequestOutput, Callable[[], RequestOutput], BaseException]


class OutputCollector:
    __slots__ = ("_item", "_ready", "pending_since", "listener")

    def __init__(self) -> None:
        self._item: Optional[Item] = None
        self._ready = asyncio.Event()
        self.pending_since: Optional[float] = None
        self.listener: Optional[asyncio.Event] = None

    def put_nowait(self, item: Item) -> None:
        if isinstance(self._item, BaseException):
            return  # the request already ended in an error: nothing follows it
        if self._item is None:
            self.pending_since = time.monotonic()
        self._item = item
        self._ready.set()
        if self.listener is not None:
            self.listener.set()

    def empty(self) -> bool:
        return self._item is None

    def get_nowait(self) -> Any:
        """The newest item (a built output, or the exception); raises asyncio.QueueEmpty."""
        item = self._item
        if item is None:
            raise asyncio.QueueEmpty()
        self._item = None
        self.pending_since = None
        self._ready.clear()
        if isinstance(item, (RequestOutput, BaseException)):
            return item
        return item()  # a builder: the snapshot is made now, for the reader that takes it

    async def get(self) -> Any:
        while self._item is None:
            await self._ready.wait()
        return self.get_nowait()
