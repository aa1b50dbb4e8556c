"""Server-sent events as OpenAI streams them: one `data: {json}` event per chunk, then
`data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
# Proxies (nginx) buffer responses unless told not to, which would stall a stream.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def parse_sse(text: str) -> list[Any]:
    """Inverse of the above, for tests and simple clients: JSON payloads, and "[DONE]" as-is."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block.startswith("data:"):
            continue
        data = block[len("data:"):].strip()
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
