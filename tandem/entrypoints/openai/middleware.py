"""ASGI middleware: API-key checks and per-route request counters.

Written as plain ASGI rather than `@app.middleware("http")`, whose wrapper buffers and re-sends
the request, which breaks disconnect detection on streams.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from typing import Any, Awaitable, Callable, Sequence

from tandem.entrypoints.openai.errors import error_body

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                   Awaitable[None]]

# Load balancers and Prometheus must reach these without a key (as in vLLM); so must the web
# page and its assets (web_page.py), which hold no data and ask for the key themselves.
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version", "/"})
OPEN_PREFIXES = ("/static/",)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        self.app = app
        self.tokens = [f"Bearer {key}".encode() for key in api_keys]

    def _authorized(self, scope: dict) -> bool:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" \
                or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            return True
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return any(secrets.compare_digest(given, token) for token in self.tokens)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self.tokens or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body("Unauthorized: pass the server's API key as "
                                     "`Authorization: Bearer KEY`", 401)).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class RequestCounterMiddleware:
    """Counts responses by (route, status) for /metrics; unknown paths share one label so a
    scanner cannot grow the label set without bound."""

    def __init__(self, app: ASGIApp, known_paths: Sequence[str]) -> None:
        self.app = app
        self.known_paths = frozenset(known_paths)
        self.counts: Counter[tuple[str, int]] = Counter()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.known_paths else "other"

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.counts[(path, int(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting_send)
