"""The lean client of `tandem bench serve` (tandem/bench/http_post.py) against canned servers:
each way a body may be framed (chunked, Content-Length, until the connection closes), lines split
across reads, headers and the request sent, and a server that closes without answering."""

from __future__ import annotations

import asyncio
import json

import pytest

from tandem.bench.http_post import NoResponse, post_json


async def _serve_once(answer: bytes, seen: list[bytes]) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        seen.append(head + await reader.readexactly(length))
        for i in range(0, len(answer), 7):  # in small pieces: lines and chunks split anywhere
            writer.write(answer[i:i + 7])
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _ask(answer: bytes) -> tuple[int, list[bytes], bytes]:
    async def run() -> tuple[int, list[bytes], bytes]:
        seen: list[bytes] = []
        server, port = await _serve_once(answer, seen)
        async with server:
            r = await post_json(f"http://127.0.0.1:{port}/v1/completions?x=1", {"a": 1},
                                {"Authorization": "Bearer k"})
            lines = [line async for line in r.lines()]
            r.close()
            return r.status, lines, seen[0]
    return asyncio.run(run())


SSE = b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
WANT = [b'data: {"n": 1}', b"", b'data: {"n": 2}', b"", b"data: [DONE]", b""]


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_each_body_framing_gives_the_same_lines(framing: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        answer = head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(SSE, 5)
    elif framing == "length":
        answer = head + b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE
    else:
        answer = head + b"\r\n" + SSE
    status, lines, request = _ask(answer)
    assert status == 200 and lines == WANT
    assert request.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in request and request.endswith(b'{"a": 1}')
    assert json.loads(request.split(b"\r\n\r\n", 1)[1]) == {"a": 1}


def test_a_status_and_a_whole_body() -> None:
    body = b'{"error": {"message": "bad"}}'
    status, lines, _ = _ask(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(body), body))
    assert status == 400 and lines == [body]


def test_a_server_that_closes_without_answering() -> None:
    with pytest.raises(NoResponse):
        _ask(b"")
