"""The engine core's outbox (core_channel.py): frames go out in order without waiting for the
API process to read, up to a bound past which `put` waits; a closed peer is ChannelClosed."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tandem.engine.core_channel import ChannelClosed, Outbox

FRAME = 64 << 10


def _frames(n: int) -> list[bytes]:
    return [bytes([i % 251]) * FRAME for i in range(n)]


def _reader(sock: socket.socket, total: int, got: bytearray, delay: float = 0.0
            ) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        while len(got) < total:
            data = sock.recv(1 << 20)
            if not data:
                return
            got.extend(data)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_frames_wait_in_the_outbox_not_in_the_sender() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        box = Outbox(ours)
        frames = _frames(64)  # 4 MiB: twenty times what the socket buffers
        t0 = time.monotonic()
        for f in frames:
            box.put(f)
        assert time.monotonic() - t0 < 1.0  # no reader, and no wait
        assert box.pending > 2 << 20
        got = bytearray()
        reader = _reader(theirs, len(frames) * FRAME, got)
        assert box.drain(timeout=30)
        reader.join(30)
        assert bytes(got) == b"".join(frames)  # every byte, in order


def test_past_its_limit_put_waits_for_the_reader() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        box = Outbox(ours, limit=1 << 20)
        frames = _frames(48)  # 3 MiB
        got = bytearray()
        reader = _reader(theirs, len(frames) * FRAME, got, delay=0.5)
        t0 = time.monotonic()
        for f in frames:
            box.put(f)
            assert box.pending <= (1 << 20) + FRAME
        assert time.monotonic() - t0 >= 0.4  # it waited for the reader to start
        assert box.drain(timeout=30)
        reader.join(30)
        assert bytes(got) == b"".join(frames)


def test_drain_gives_up_after_its_timeout_and_a_closed_peer_is_channel_closed() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        box = Outbox(ours)
        for f in _frames(16):
            box.put(f)
        assert not box.drain(timeout=0.2)  # nobody reads
        theirs.close()
        with pytest.raises(ChannelClosed):
            box.drain(timeout=5)
