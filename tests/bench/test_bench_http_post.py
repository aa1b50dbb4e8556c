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


def test_chunks_that_arrive_together_and_chunk_extensions() -> None:
    body = _chunked(SSE, 3).replace(b"\r\n", b";ext=1\r\n", 1)  # an extension on the first size
    # _serve_once writes 7 bytes at a time; here the whole answer goes in one write too
    async def run() -> list[bytes]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(8)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            r = await post_json(f"http://127.0.0.1:{port}/", {"a": 1})
            pieces = [c async for c in r.body_chunks()]
            r.close()
            return pieces
    pieces = asyncio.run(run())
    assert b"".join(pieces) == SSE and len(pieces) < len(SSE) // 3  # de-chunked per read


def _stream(*events: str) -> bytes:
    sse = b"".join(b"data: %s\n\n" % e.encode() for e in events) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(sse, 40)


def _timed(answer: bytes) -> dict:
    from tandem.bench.serve import _timed as timed

    async def run() -> dict:
        server, port = await _serve_once(answer, [])
        async with server:
            return await timed(f"http://127.0.0.1:{port}/v1/completions", {"stream": True}, {})
    return asyncio.run(run())


def test_the_client_counts_text_chunks_and_reads_usage_and_errors() -> None:
    got = _timed(_stream('{"choices":[{"index":0,"text":"a"}]}',
                         '{"choices":[{"index":0,"text": "\\"usage\\""}]}',  # text, not usage
                         '{"choices":[{"index":0,"text":""}]}',  # held back: no token's text
                         '{"choices":[{"index":0,"text":"b"}],"usage":null}',
                         '{"choices":[],"usage":{"completion_tokens":4}}'))
    assert got["tokens"] == 4 and got["usage"] and len(got["gaps"]) == 2  # three text chunks
    no_usage = _timed(_stream('{"choices":[{"text":"a"}]}', '{"choices":[{"text":"b"}]}'))
    assert no_usage["tokens"] == 2 and not no_usage["usage"]
    with pytest.raises(RuntimeError, match="stream error: .*fell over"):
        _timed(_stream('{"choices":[{"text":"a"}]}', '{"error":{"message":"fell over"}}'))
