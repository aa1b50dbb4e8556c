"""Tool calling in chat completions: `tools` and `tool_choice` checked as vLLM checks them, and
what each choice means for generation and for the response.

- "none": the tools go to the chat template; the output is plain content.
- "auto" (the default when tools are given): needs `--enable-auto-tool-choice --tool-call-parser
  NAME`; the model decides, and the parser finds the calls in its text.
- "required": the output is constrained (structured outputs) to a JSON array of one or more
  `{"name": ..., "parameters": ...}` objects, each matching its tool's schema.
- named (`{"type": "function", "function": {"name": ...}}`): the output is constrained to that
  tool's parameters schema and becomes the call's arguments.
The constrained modes use the same grammar masking as structured outputs, so they stay exact
with a draft model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from tandem.entrypoints.openai.errors import OpenAIError
from tandem.entrypoints.openai.tool_parsers import TOOL_PARSERS, tool_call
from tandem.sample.structured_params import StructuredOutputsParams

AUTO_NEEDS_FLAGS = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                    'to be set')


@dataclass(frozen=True)
class ToolPlan:
    mode: str                                  # none | auto | required | named
    tools: list[dict[str, Any]]                # for the chat template
    structured: Optional[StructuredOutputsParams] = None
    name: Optional[str] = None                 # the named tool
    parser: Optional[str] = None               # auto: the --tool-call-parser

    def choice_state(self) -> ChoiceTools:
        return ChoiceTools(self)


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def _check_tools(tools: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise OpenAIError("tools must be a non-empty list of function tools", param="tools")
    by_name: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise OpenAIError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"parameters\": {...}}}", param="tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise OpenAIError(f"tools[{i}].function.parameters must be a JSON schema object",
                              param="tools")
        by_name[fn["name"]] = tool
    return by_name


def plan_tools(tools: Any, tool_choice: Any, enable_auto: bool,
               parser: Optional[str]) -> Optional[ToolPlan]:
    """The request's tool plan, or None when it uses no tools. Raises OpenAIError (400)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise OpenAIError("When using `tool_choice`, `tools` must be set.",
                              param="tool_choice")
        return None
    by_name = _check_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan("none", tools)
    if choice == "auto":
        if not enable_auto or parser is None:
            raise OpenAIError(AUTO_NEEDS_FLAGS, param="tool_choice")
        return ToolPlan("auto", tools, parser=parser)
    if choice == "required":
        items = [{"type": "object",
                  "properties": {"name": {"type": "string", "enum": [name]},
                                 "parameters": _schema(tool)},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, tool in by_name.items()]  # no other keys (xgrammar's strict mode)
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        return ToolPlan("required", tools, StructuredOutputsParams(json=schema))
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise OpenAIError('a named tool_choice is {"type": "function", "function": '
                              '{"name": ...}}', param="tool_choice")
        if name not in by_name:
            raise OpenAIError(f"Tool '{name}' has not been passed in `tools`.",
                              param="tool_choice")
        return ToolPlan("named", tools, StructuredOutputsParams(json=_schema(by_name[name])),
                        name=name)
    raise OpenAIError(f"Invalid value for `tool_choice`: {choice!r}; allowed: 'none', 'auto', "
                      "'required' or a named function", param="tool_choice")


class ChoiceTools:
    """One choice's tool calls: from a whole output (`message`) or streamed (`feed`/`finish`)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.parser = TOOL_PARSERS[plan.parser]() if plan.mode == "auto" else None
        self._named_id: Optional[str] = None
        self._buffer = ""
        self.called = False

    def message(self, text: str) -> tuple[Optional[str], list[dict[str, Any]]]:
        """(content, tool_calls) of a finished output."""
        mode = self.plan.mode
        if mode == "none":
            return text, []
        if mode == "auto":
            parsed = self.parser.extract(text)
            self.called = bool(parsed.tool_calls)
            return parsed.content, parsed.tool_calls
        if mode == "named":
            self.called = True
            return None, [tool_call(self.plan.name, text)]
        calls = _required_calls(text)
        self.called = calls is not None
        return (None, calls) if calls is not None else (text, [])

    def feed(self, text: str) -> dict[str, Any]:
        """The delta for newly generated `text`."""
        mode = self.plan.mode
        if not text or mode == "none":
            return {"content": text} if text else {}
        if mode == "auto":
            delta = self.parser.feed(text)
            self.called = self.parser.called
            return delta
        if mode == "named":  # arguments stream as they come; the first delta names the call
            self.called = True
            if self._named_id is None:
                call = {"index": 0, **tool_call(self.plan.name, text)}
                self._named_id = call["id"]
                return {"tool_calls": [call]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        self._buffer += text  # required: a JSON array, parsed once complete
        return {}

    def finish(self) -> dict[str, Any]:
        if self.plan.mode == "auto":
            delta = self.parser.finish()
            self.called = self.parser.called
            return delta
        if self.plan.mode == "required":
            text, self._buffer = self._buffer, ""
            calls = _required_calls(text)
            self.called = calls is not None
            if calls is None:
                return {"content": text} if text else {}
            return {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
        return {}

    def finish_reason(self, reason: Optional[str]) -> Optional[str]:
        """vLLM's: "tool_calls" when auto found calls or required completed; named keeps its
        own reason."""
        if reason is None:
            return None
        if self.plan.mode == "auto" and self.called:
            return "tool_calls"
        if self.plan.mode == "required" and self.called and reason == "stop":
            return "tool_calls"
        return reason


def _required_calls(text: str) -> Optional[list[dict[str, Any]]]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return None  # cut off (max_tokens): the text is returned as content
    if not isinstance(items, list):
        return None
    return [tool_call(item["name"], json.dumps(item.get("parameters", {}), ensure_ascii=False))
            for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)]
