"""What the server adds to every answer's latency: Nagle's algorithm on its sockets; and the
OpenMP settings of the engine process (chosen by measurement for it, since the event loop is in
another process now) and of the API process (left alone)."""

from __future__ import annotations

import os
import socket
import statistics
import time
from pathlib import Path

import httpx
import pytest

from entrypoints.server_helpers import ServerProcess, engine_pid
from tandem import cli


def test_accepted_connections_have_nagle_off() -> None:
    """asyncio sets TCP_NODELAY only where the socket's proto says TCP; a listener made with
    proto 0 passed 0 on to every connection, and Nagle stayed on."""
    listener = cli.bind_socket("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    try:
        assert conn.proto == socket.IPPROTO_TCP
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        for s in (conn, client, listener):
            s.close()


def test_keep_alive_answers_are_not_held_for_a_delayed_ack(server: ServerProcess) -> None:
    """With Nagle on, each answer after a connection's first held its body back behind the
    headers until the client's delayed ACK: 44 ms for every /v1/models, against 1-2 ms now."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        client.get("/v1/models")
        took = []
        for _ in range(7):
            t0 = time.perf_counter()
            assert client.get("/v1/models").status_code == 200
            took.append(time.perf_counter() - t0)
    assert statistics.median(took) < 0.02, [round(t * 1000) for t in took]


def test_the_engine_process_waits_as_openmp_does_by_default(server: ServerProcess) -> None:
    """Passive waits, which `tandem serve` set while the engine shared the event loop's process,
    cost the engine process a quarter of its single-stream rate (docs/performance.md): it gets
    the OpenMP variables the user set, and no others."""
    environ = Path(f"/proc/{engine_pid(server)}/environ").read_bytes().split(b"\0")
    engine_env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES",
                 "OMP_NUM_THREADS"):
        assert engine_env.get(name) == os.environ.get(name), name


def test_serve_leaves_its_own_environment_alone(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    before = dict(os.environ)
    cli.serve(["--help"], time.perf_counter())
    assert "usage" in capsys.readouterr().out.lower()
    assert dict(os.environ) == before
