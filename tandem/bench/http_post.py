"""A lean HTTP/1.1 POST for `tandem bench serve`: asyncio streams, one connection per request.

The benchmark client shares the machine with the server it measures. httpx's async client spent
520 us of CPU per streamed token at one stream (Intel Xeon 6/167, 2 cores): more than the
server's own API process, and taken from the engine's cores. This one reads the response as
bytes and hands out its body's lines as they come: a status line, headers, then a body framed by
`Transfer-Encoding: chunked`, by `Content-Length`, or by the end of the connection (each of
which servers use for SSE). `https://` URLs go over TLS.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, AsyncIterator, Optional
from urllib.parse import urlsplit


class NoResponse(Exception):
    """The connection closed before a status line came (nothing was answered)."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.status = status
        self.headers = headers  # names lower-cased
        self._reader = reader
        self._writer = writer

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, de-chunked."""
        r = self._reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            # What each read brings is de-chunked at once: one await per arrival, where a
            # readline and a readexactly per chunk (a token's event, on a stream) cost the
            # client two.
            buf = bytearray()
            while True:
                data, at, last = [], 0, False
                while (eol := buf.find(b"\r\n", at)) >= 0:
                    size = int(bytes(buf[at:eol]).split(b";", 1)[0].strip() or b"0", 16)
                    end = eol + 2 + size + 2  # the size line, the data, its CRLF
                    if len(buf) < end:
                        break
                    if size == 0:  # the last chunk: no trailers are sent, a CRLF ends it
                        last = True
                        break
                    data.append(bytes(buf[eol + 2:end - 2]))
                    at = end
                del buf[:at]
                if data:
                    yield b"".join(data)
                if last:
                    return
                more = await r.read(1 << 16)
                if not more:
                    raise ConnectionError("the connection closed inside a chunked body")
                buf += more
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("the connection closed inside the body")
                left -= len(data)
                yield data
        else:
            while data := await r.read(1 << 16):
                yield data

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (without their newline) as they complete."""
        pending = b""
        async for data in self.body_chunks():
            pending += data
            *done, pending = pending.split(b"\n")
            for line in done:
                yield line.rstrip(b"\r")
        if pending:
            yield pending

    async def read(self) -> bytes:
        return b"".join([c async for c in self.body_chunks()])

    def close(self) -> None:
        self._writer.close()


async def post_json(url: str, body: dict[str, Any], headers: Optional[dict[str, str]] = None
                    ) -> Response:
    """POST `body` as JSON; returns once the status line and headers arrived (close the
    Response when done). Raises NoResponse when the server closed without answering."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if tls else 80)
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ssl.create_default_context() if tls else None, limit=1 << 20)
    data = json.dumps(body).encode()
    head = [f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {parts.netloc}", "Content-Type: application/json", "Accept: */*",
            f"Content-Length: {len(data)}", "Connection: close",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        try:
            status_line = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError as e:
            raise NoResponse(f"closed after {len(e.partial)} bytes, before a status line") \
                from None
        status = int(status_line.split(b" ", 2)[1])
        fields: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            fields[name.strip().lower()] = value.strip()
    except BaseException:
        writer.close()
        raise
    return Response(status, fields, reader, writer)
