"""The web page of `tandem serve` at `/`: a prompt box whose streamed output marks every token as
an accepted draft or the target's own, beside live acceptance figures and the server's totals.

The page is static (static/index.html; app.js, which uses spec.js for the figures, api.js for
requests and the SSE reader, tokens.js for token spans and charts.js; style.css and a vendored
Chart.js) and talks to the server only through the public API (/v1/models, /v1/completions,
/v1/chat/completions with `spec_decode_token_origin`, /metrics), so it shows nothing a client
could not get. Every asset ships inside the package: the page works on a machine without a
network. The page and its assets are served without an API key (middleware.py lists them); the
page asks for the key itself when the API answers 401.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

from tandem.entrypoints.openai.errors import OpenAIError

STATIC_DIR = Path(__file__).with_name("static")
PAGE_PATH = "/"
STATIC_PREFIX = "/static/"

# Explicit types rather than the `mimetypes` module, whose answers depend on the host's
# /etc/mime.types (some map .js to text/plain, which browsers refuse to run with nosniff).
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8"}
# The assets change with the package, not while a server runs; revalidating each load keeps a
# browser from running a stale app.js against a newer server.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _assets() -> dict[str, Path]:
    """URL name ("app.js", "vendor/chart.umd.min.js") -> file, read once: only files that ship
    in static/ can be served, so no path a client writes can reach outside it."""
    files = (p for p in STATIC_DIR.rglob("*") if p.is_file() and p.suffix in _CONTENT_TYPES)
    return {p.relative_to(STATIC_DIR).as_posix(): p for p in files}


def add_page_routes(app: FastAPI) -> None:
    """Serve the page at `/` and its assets under `/static/`."""
    assets = _assets()
    methods = ["GET", "HEAD"]  # HEAD too: curl -I and link checkers ask with it

    @app.api_route(PAGE_PATH, methods=methods, include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type=_CONTENT_TYPES[".html"],
                            headers=_HEADERS)

    @app.api_route(STATIC_PREFIX + "{name:path}", methods=methods, include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        path = assets.get(name)
        if path is None:
            raise OpenAIError(f"no such file: /static/{name}", 404)
        return FileResponse(path, media_type=_CONTENT_TYPES[path.suffix], headers=_HEADERS)
