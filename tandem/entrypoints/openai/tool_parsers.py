"""Tool-call parsers for `tool_choice: "auto"` (vLLM's `--tool-call-parser NAME`).

Hermes format (NousResearch Hermes 2 Pro, Qwen2.5/Qwen3 and SmolLM3 templates): the model writes
text, then one or more

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A parser extracts the calls from a whole output, or incrementally from streamed text deltas: text
outside tool-call tags streams as content at once (a possible start of a tag is held back), and a
call is emitted whole, as one `tool_calls` delta, when its closing tag arrives. A call whose JSON
does not parse stays content, as in vLLM: the client sees what the model wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One entry of OpenAI's `message.tool_calls`."""
    return {"id": tool_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _parse_call(body: str) -> Optional[tuple[str, str]]:
    """(name, arguments as JSON text) from a Hermes call body, or None if it is not one."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    return data["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


@dataclass
class ParsedOutput:
    content: Optional[str]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class HermesToolParser:
    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def __init__(self) -> None:
        self._buffer = ""        # streamed text not yet emitted
        self._num_calls = 0

    # ---- a whole output ------------------------------------------------------------------

    def extract(self, text: str) -> ParsedOutput:
        if self.START not in text:
            return ParsedOutput(text)
        calls = [_parse_call(m.group(1).strip()) for m in self._CALL.finditer(text)]
        if not calls or any(c is None for c in calls):
            return ParsedOutput(text)
        content = text[:text.index(self.START)].strip()
        return ParsedOutput(content or None, [tool_call(n, a) for n, a in calls])

    # ---- streamed text -------------------------------------------------------------------

    def feed(self, delta: str) -> dict[str, Any]:
        """The chat delta (`content` and/or `tool_calls`) that `delta` lets us emit now."""
        self._buffer += delta
        content, calls = "", []
        while self._buffer:
            start = self._buffer.find(self.START)
            if start < 0:
                keep = _partial_suffix(self._buffer, self.START)
                content += self._buffer[:len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep:]
                break
            content += self._buffer[:start]
            end = self._buffer.find(self.END, start)
            if end < 0:
                self._buffer = self._buffer[start:]
                break
            body = self._buffer[start + len(self.START):end]
            self._buffer = self._buffer[end + len(self.END):]
            parsed = _parse_call(body.strip())
            if parsed is None:
                content += self.START + body + self.END
            else:
                calls.append(self._delta_call(*parsed))
        return _delta(content, calls)

    def finish(self) -> dict[str, Any]:
        """What is left at the end of the output: an unclosed call, or held-back text."""
        rest, self._buffer = self._buffer, ""
        if rest.startswith(self.START):
            parsed = _parse_call(rest[len(self.START):].strip())
            if parsed is not None:
                return _delta("", [self._delta_call(*parsed)])
        return _delta(rest, [])

    @property
    def called(self) -> bool:
        return self._num_calls > 0

    def _delta_call(self, name: str, arguments: str) -> dict[str, Any]:
        call = {"index": self._num_calls, **tool_call(name, arguments)}
        self._num_calls += 1
        return call


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _delta(content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if content:
        out["content"] = content
    if calls:
        out["tool_calls"] = calls
    return out


TOOL_PARSERS = {"hermes": HermesToolParser}
