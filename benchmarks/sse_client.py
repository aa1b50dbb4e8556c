"""A lean streaming client for server benchmarks: many SSE streams on one asyncio loop, raw HTTP/1.1
over sockets, the body kept as bytes and parsed once at its end.

On a 2-core machine the client shares the cores with the server it measures. 16 httpx streams
on 16 threads, parsing each chunk as it comes, took 0.28 of a core in bench_serve_core.py (Zen 4),
and the server lost about as much; this client takes 0.03. What it reads is the same: every byte
of every stream, until the server ends the response.
"""

from __future__ import annotations

import asyncio
import json
import time

from tandem.bench.serve import TEXT_CHUNK


async def stream_completion(host: str, port: int, body: dict) -> tuple[float, float, int]:
    """POST /v1/completions with `body` (stream on, usage included): (seconds to the first chunk
    with text, seconds to the end of the response, completion tokens from its usage chunk)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % (host.encode(), len(data)) + data)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status or b"chunked" not in head.lower():
            raise RuntimeError(f"unexpected response: {head[:300]!r}")
        parts: list[bytes] = []
        first = 0.0
        while True:  # chunked transfer encoding: a hex size line, the bytes, CRLF; size 0 ends
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                break
            parts.append((await reader.readexactly(size + 2))[:-2])
            if not first and TEXT_CHUNK.search(parts[-1]):
                first = time.perf_counter() - t0
    finally:
        writer.close()
    took = time.perf_counter() - t0
    for line in reversed(b"".join(parts).decode().split("\n")):
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return first, took, usage["completion_tokens"]
    raise RuntimeError("the stream ended without a usage chunk")


def concurrent_streams(url: str, bodies: list[dict]
                       ) -> tuple[float, list[tuple[float, float, int]]]:
    """All `bodies` streamed at once from `url` (http://host:port): (seconds until the last
    ends, each stream's (first text, end, completion tokens) as stream_completion's)."""
    host, port = url.split("://", 1)[1].rstrip("/").rsplit(":", 1)

    async def run() -> list[tuple[float, float, int]]:
        return await asyncio.gather(*(stream_completion(host, int(port), b) for b in bodies))

    t0 = time.perf_counter()
    results = asyncio.run(run())
    return time.perf_counter() - t0, results
