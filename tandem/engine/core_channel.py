"""The engine core's end of its channel to the API process: the configuration frame read at
start-up, and the frames out, sent without waiting for the API process to read them.

A blocking `sendall` on the step thread tied the step rate to the API process: when its event
loop was busy (a long tokenization, a burst of connections) and the socket's buffer (about
200 KB) filled, the next step waited. The outbox sends what the socket takes now and keeps the
rest, in order; the core's loop sends more whenever the socket is writable (`pending` says to
select for it) and after every step. Only past `limit` bytes unsent, an API process that reads
nothing for that long, does `put` wait for the socket: memory stays bounded, and a stopped
reader still stops the core in the end, as the watchdog on the other side expects.

No thread: a sender thread would run on the cores the step's OpenMP threads use, and sending
from the step thread costs 1-3% of its time (benchmarks/LOG.md, issue 45).
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any, Optional

from tandem.engine.core_messages import FrameBuffer

DEFAULT_LIMIT = 64 << 20  # bytes unsent before `put` waits for the reader
RECV_BYTES = 1 << 20


class ChannelClosed(Exception):
    """The API process closed its end: nobody is left to serve."""


def read_config(sock: socket.socket) -> tuple[Any, bool]:
    """The first frame: (engine configuration, log_stats)."""
    frames = FrameBuffer()
    while True:
        data = sock.recv(RECV_BYTES)
        if not data:
            raise ChannelClosed()
        messages = frames.feed(data)
        if messages:
            return messages[0]


class Outbox:
    def __init__(self, sock: socket.socket, limit: int = DEFAULT_LIMIT) -> None:
        self._sock = sock
        self._buf = bytearray()
        self.limit = limit

    @property
    def pending(self) -> int:
        """Bytes not yet taken by the socket."""
        return len(self._buf)

    def put(self, frame: bytes) -> None:
        """Send `frame` after what is pending, as far as the socket takes it now."""
        if self._buf:
            self._buf += frame
            self.flush()
        else:  # the usual case: straight to the socket, no copy unless it is full
            sent = self._send(frame)
            if sent < len(frame):
                self._buf += memoryview(frame)[sent:]
        if len(self._buf) > self.limit:
            self.drain(until=self.limit // 2)

    def flush(self) -> None:
        """Send what the socket takes now (never waits)."""
        if self._buf:
            sent = self._send(self._buf)
            del self._buf[:sent]

    def drain(self, timeout: Optional[float] = None, until: int = 0) -> bool:
        """Wait until at most `until` bytes are pending (or `timeout` seconds have passed);
        True when they are."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._buf) > until:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _, writable, _ = select.select([], [self._sock], [], left)
            if writable:
                self.flush()
        return True

    def _send(self, data: bytes | bytearray | memoryview) -> int:
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError):
            raise ChannelClosed() from None
