"""What completions and chat serving share: the model-name check, prompt validation, length
checks, SamplingParams from a request, running several engine requests as one response, usage and
the speculative statistics attached to every response.

Tokenization runs in a worker thread (`asyncio.to_thread`), never on the event loop, so a
multi-megabyte prompt does not stall /health or the other streams. Engine requests get ids of the
server's own (`random_id`); a client's `request_id` only names the response, so no client can pick
an id that collides with another request inside the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any, AsyncIterator, Optional, Sequence, Union

from tandem.engine.engine_client import (EngineClient, EngineDeadError, EngineStepError,
                                         ReaderStalledError)
from tandem.engine.output_collector import OutputCollector
from tandem.entrypoints.openai.errors import OpenAIError
from tandem.entrypoints.openai.request_params import RequestParams
from tandem.outputs import RequestOutput, SpecDecodeRequestStats
from tandem.sample.structured_params import StructuredOutputsParams
from tandem.sampling_params import SamplingParams

logger = logging.getLogger("tandem.server")
_MAX_TOKEN_CHARS: dict[int, int] = {}


def max_token_chars(tokenizer: Any) -> int:
    """The longest token string in the vocabulary: no token covers more characters of text (a
    byte-level string is at least as long as the text it stands for), so a text of C characters
    has at least C / this many tokens."""
    key = id(tokenizer)
    if key not in _MAX_TOKEN_CHARS:
        vocab = tokenizer.get_vocab()
        added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
        _MAX_TOKEN_CHARS[key] = max([len(s) for s in vocab] + [len(s) for s in added] + [1])
    return _MAX_TOKEN_CHARS[key]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """Server-wide settings from the command line."""
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    log_requests: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None


class OpenAIServing(RequestParams):
    def __init__(self, engine: EngineClient, served_model_names: Sequence[str],
                 chat_template: Optional[str] = None,
                 trust_request_chat_template: bool = False, options: Any = None) -> None:
        self.engine = engine
        self.trust_request_chat_template = trust_request_chat_template
        self.options = options or ServingOptions()
        self.defaults = dict(getattr(engine, "sampling_defaults", {}) or {})
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.served_model_names = list(served_model_names)
        self.chat_template = chat_template
        self.max_token_chars = max_token_chars(self.tokenizer)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, model: Optional[str]) -> str:
        if model is None or model in self.served_model_names:
            return model or self.model_name
        raise OpenAIError(f"The model `{model}` does not exist.", 404, param="model")

    # ---- prompts ---------------------------------------------------------------------------

    def check_token_ids(self, ids: Sequence[int]) -> list[int]:
        if not ids:
            raise OpenAIError("The prompt is empty: give at least one token.", param="prompt")
        for t in ids:
            if t < 0 or t >= self.vocab_size:
                raise OpenAIError(f"Token id {t} is out of vocabulary (vocab size "
                                  f"{self.vocab_size}).", param="prompt")
        return list(ids)

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if not text:
            raise OpenAIError("The prompt is empty.", param="prompt")
        at_least = len(text) // self.max_token_chars
        if at_least >= self.max_model_len:  # cannot fit: no need to tokenize megabytes
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has at least {at_least} tokens ({len(text)} characters), which "
                "leaves no room for a completion. Please reduce the length of the prompt.",
                param="prompt")
        encoded = await asyncio.to_thread(self.tokenizer, text,
                                          add_special_tokens=add_special_tokens)
        return self.check_token_ids(encoded.input_ids)

    def check_length(self, prompt_len: int, max_tokens: Optional[int],
                     what: str = "prompt") -> int:
        """Resolve max_tokens (None = fill the context) and refuse requests that cannot fit."""
        if prompt_len >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your {what} has {prompt_len} tokens, which leaves no room for a completion. "
                f"Please reduce the length of the {what}.", param="prompt")
        if max_tokens is None:  # the generation config's max_new_tokens, else the room left
            room = self.max_model_len - prompt_len
            return min(room, int(self.defaults.get("max_tokens") or room))
        if max_tokens >= 1 and prompt_len + max_tokens > self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the {what}, "
                f"{max_tokens} in the completion). Please reduce the length of the {what} or "
                f"completion.", param="max_tokens")
        return max_tokens

    async def compile_grammar(self, spec: Optional[StructuredOutputsParams]) -> None:
        """Compile (or find cached) the grammar in a worker thread, so neither the event loop
        nor the engine's steps wait for it."""
        compiler = getattr(self.engine, "grammars", None)
        if spec is None or compiler is None:
            return
        try:
            await asyncio.to_thread(compiler.prototype, spec)
        except ValueError as e:
            raise OpenAIError(str(e), param="structured_outputs") from None

    # ---- running requests ------------------------------------------------------------------

    async def start(self, jobs: Sequence[tuple[Union[str, list[int]], SamplingParams]],
                    final_only: bool = False) -> list[tuple[str, OutputCollector]]:
        """Add every request before streaming any, so a bad one fails the whole call with 400.
        Each gets a fresh internal id. `final_only` (a response that is not streamed): the
        engine sends each request's output once, when it has finished."""
        started: list[tuple[str, OutputCollector]] = []
        try:
            for prompt, params in jobs:
                request_id = random_id("req")
                if self.options.log_requests:
                    logger.info("Received request %s: %d prompt tokens, params: %s", request_id,
                                len(prompt) if isinstance(prompt, list) else -1, params)
                started.append((request_id, await self.engine.add_request(
                    request_id, prompt, params, final_only=final_only)))
        except BaseException as e:
            for request_id, _ in started:
                self.engine.abort_nowait(request_id)
            if isinstance(e, EngineDeadError):
                raise OpenAIError(str(e), 503) from None
            if isinstance(e, ValueError):
                raise OpenAIError(str(e)) from None
            raise
        return started

    async def merge(self, started: Sequence[tuple[str, OutputCollector]]
                    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of several requests as (request index, cumulative output), as they come. Each
        request's collector keeps only its newest output, and nothing is read ahead of the
        consumer: a consumer that stops (a client that no longer reads its stream) holds one
        output per request, never one per step. Leaving early aborts every request that has not
        finished."""
        woken = asyncio.Event()  # set by any collector's put
        for _, stream in started:
            stream.listener = woken
        live = list(range(len(started)))
        try:
            while live:
                woken.clear()  # what came before is in the collectors, which are read next
                taken = False
                for i in list(live):
                    stream = started[i][1]
                    if stream.empty():
                        continue
                    item = stream.get_nowait()
                    taken = True
                    if isinstance(item, EngineStepError):
                        raise OpenAIError(str(item), 500) from None
                    if isinstance(item, EngineDeadError):
                        raise OpenAIError(str(item), 503) from None
                    if isinstance(item, ReaderStalledError):
                        raise OpenAIError(str(item), 408) from None
                    if isinstance(item, BaseException):
                        raise item
                    if item.finished:
                        live.remove(i)
                    yield i, item
                if not taken:
                    await woken.wait()
        finally:
            for i in live:
                self.engine.abort_nowait(started[i][0])
            for _, stream in started:
                stream.listener = None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_metrics(outputs: Sequence[Optional[RequestOutput]]) -> dict[str, Any]:
    """vLLM-style per-response statistics: `{"speculative_decoding": {...} | None}`."""
    total: Optional[SpecDecodeRequestStats] = None
    for out in outputs:
        stats = out.spec_decode_stats if out is not None else None
        if stats is not None:
            total = total or SpecDecodeRequestStats()
            total.merge(stats)
    return {"speculative_decoding": total.to_dict() if total is not None else None}
