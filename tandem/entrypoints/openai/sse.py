"""Server-sent events as OpenAI streams them: one `data: {json}` event per chunk, then
`data: [DONE]`.

Events are bytes encoded by msgspec (UTF-8, compact, key order kept, as `json.dumps` with
`ensure_ascii=False` writes them): a token's chunk is encoded once per token per stream, and
msgspec does it in a tenth of the time (0.34 against 3.6 us, warm). JSON has no NaN or
infinity; msgspec writes them as null (the logprobs are clamped before: logprobs.py).
"""

from __future__ import annotations

import json
from typing import Any, Union

import msgspec

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
# Proxies (nginx) buffer responses unless told not to, which would stall a stream.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_ENCODER = msgspec.json.Encoder()


def sse_event(payload: Any) -> bytes:
    return b"data: " + _ENCODER.encode(payload) + b"\n\n"


def parse_sse(text: Union[str, bytes]) -> list[Any]:
    """Inverse of the above, for tests and simple clients: JSON payloads, and "[DONE]" as-is."""
    if isinstance(text, bytes):
        text = text.decode()
    events: list[Any] = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block.startswith("data:"):
            continue
        data = block[len("data:"):].strip()
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
