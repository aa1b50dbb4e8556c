"""Chat messages -> prompt text through the tokenizer's (or a user-supplied) Jinja chat template.

Shared by the server and the offline `LLM.chat`, so errors are plain ValueErrors that each caller
maps to its own surface (a 400 on the server).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

T = TypeVar("T")


class ChatTemplateError(ValueError):
    """The tokenizer has no chat template and none was supplied."""


class TemplateTimeoutError(ValueError):
    """A chat template ran past its time limit."""


def run_with_time_limit(fn: Callable[[], T], seconds: Optional[float]) -> T:
    """Run `fn` in this thread, raising TemplateTimeoutError once `seconds` have passed. Jinja
    compiles templates to Python, so a line tracer can interrupt any loop a template runs
    (transformers renders them in Jinja's sandbox, which keeps them from reaching Python's
    internals but not from looping for hours). Tracing costs time, so only templates a request
    supplied get it."""
    if seconds is None:
        return fn()
    deadline = time.monotonic() + seconds

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateTimeoutError(f"the chat template ran for more than {seconds:g} s and "
                                       "was stopped")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(previous)


NO_TEMPLATE_MESSAGE = (
    "This model's tokenizer has no chat template (it is probably a base model), so chat messages "
    "cannot be formatted. Start the server with `--chat-template FILE_OR_TEMPLATE`, or pass "
    "`chat_template=` to `LLM.chat`, or use the completions API instead.")


def load_chat_template(value: Optional[str]) -> Optional[str]:
    """`--chat-template` takes a file path or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")


class ContentPartError(ValueError):
    """A message content part the server cannot take; `param` names it (messages[i].content[j])."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# OpenAI's and vLLM's multimodal part types: every model here is served as text.
_MEDIA_PARTS = ("image_url", "input_image", "image", "image_pil", "image_embeds", "input_audio",
                "audio_url", "video_url")


def _content_text(content: Any, where: str = "content") -> str:
    """Content is a string or OpenAI's list of parts; only text parts are supported."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable) and not isinstance(content, (bytes, Mapping)):
        texts: list[str] = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            param = f"{where}[{j}]"
            if not isinstance(part, Mapping):
                raise ContentPartError(f"{param}: unsupported message content part: {part!r}",
                                       param)
            kind = part.get("type", "text")
            if kind in _MEDIA_PARTS:
                raise ContentPartError(
                    f"{param}.type is {kind!r}, but this model is served as text only: tandem "
                    f"takes no image, audio or video input (a multimodal checkpoint such as "
                    f"Gemma3ForConditionalGeneration runs its language model alone). Send "
                    f"text parts only.", f"{param}.type")
            if kind not in ("text", "input_text"):
                raise ContentPartError(f"{param}.type: unsupported message content part type "
                                       f"{kind!r}: this server accepts text parts only",
                                       f"{param}.type")
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise ValueError(f"unsupported message content: {content!r}")


def _template_tool_call(call: Any) -> Any:
    """An earlier tool call as templates expect it: `arguments` as an object, not JSON text
    (Qwen's and Hermes' templates serialise it themselves), as vLLM passes it."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        arguments = json.loads(fn["arguments"])
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**fn, "arguments": arguments}}


def normalize_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain dicts with string content; other keys (name, tool_calls, ...) pass through."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"each message needs a 'role', got {message!r}")
        item = {k: v for k, v in message.items() if v is not None}
        item["content"] = _content_text(message.get("content"), f"messages[{i}].content")
        if isinstance(item.get("tool_calls"), list):
            item["tool_calls"] = [_template_tool_call(c) for c in item["tool_calls"]]
        out.append(item)
    return out


def apply_chat_template(tokenizer: Any, messages: Iterable[Mapping[str, Any]],
                        chat_template: Optional[str] = None, add_generation_prompt: bool = True,
                        continue_final_message: bool = False, **template_kwargs: Any) -> str:
    """Render `messages` to prompt text. Raises ChatTemplateError when no template exists and
    ValueError for malformed messages or incompatible options."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ChatTemplateError(NO_TEMPLATE_MESSAGE)
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true: "
                         "set add_generation_prompt=false to continue the final message")
    conversation = normalize_messages(messages)
    if continue_final_message and (not conversation
                                   or conversation[-1].get("role") != "assistant"):
        raise ValueError("continue_final_message needs a final assistant message to continue")
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **template_kwargs)
    except (ChatTemplateError, TemplateTimeoutError):
        raise
    except Exception as e:  # jinja errors (raise_exception, undefined names) are the user's
        raise ValueError(f"chat template failed: {e}") from e
    if not isinstance(text, str):  # some tokenizers return a list for batched input
        text = text[0]
    return text
