"""POST /v1/chat/completions: messages -> chat template -> one engine request -> `chat.completion`
or a stream of `chat.completion.chunk` deltas (the first delta of each choice carries the role)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import JSONResponse, StreamingResponse

from tandem.entrypoints.chat_utils import apply_chat_template, run_with_time_limit
from tandem.entrypoints.openai.errors import OpenAIError, sse_error
from tandem.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_json
from tandem.entrypoints.openai.protocol import ChatCompletionRequest
from tandem.entrypoints.openai.reasoning_parsers import (CONTENT, ReasoningStream,
                                                         make_reasoning_parser)
from tandem.entrypoints.openai.serving_engine import (OpenAIServing, now, random_id,
                                                      spec_metrics, usage)
from tandem.entrypoints.openai.sse import DONE, HEADERS, MEDIA_TYPE, sse_event
from tandem.entrypoints.openai.token_origin import token_origin_fields
from tandem.entrypoints.openai.tool_choice import ChoiceTools, ToolPlan, plan_tools
from tandem.outputs import CompletionOutput, RequestOutput

REQUEST_TEMPLATE_TIME_LIMIT_S = 2.0  # a template sent with a request renders for at most this
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template "
                      "is not set. Refused request with untrusted chat template.")


class OpenAIServingChat(OpenAIServing):

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reasoning = make_reasoning_parser(self.options.reasoning_parser, self.tokenizer)

    async def render(self, request: ChatCompletionRequest, tools: Optional[ToolPlan]) -> str:
        """Messages to prompt text in a worker thread; a template sent with the request needs
        --trust-request-chat-template and renders under a time limit."""
        kwargs = dict(request.chat_template_kwargs or {})
        request_template = request.chat_template or kwargs.pop("chat_template", None)
        if request_template is not None and not self.trust_request_chat_template:
            raise OpenAIError(UNTRUSTED_TEMPLATE, param="chat_template")
        if tools is not None:
            kwargs.setdefault("tools", tools.tools)
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        render = functools.partial(
            apply_chat_template, self.tokenizer, messages, request_template or self.chat_template,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message, **kwargs)
        limit = REQUEST_TEMPLATE_TIME_LIMIT_S if request_template is not None else None
        try:
            return await asyncio.to_thread(run_with_time_limit, render, limit)
        except ValueError as e:
            raise OpenAIError(str(e), param=getattr(e, "param", "messages")) from None

    async def create(self, request: ChatCompletionRequest
                     ) -> Union[JSONResponse, StreamingResponse]:
        model = self.check_model(request.model)
        if not request.messages:
            raise OpenAIError("messages must not be empty", param="messages")
        tools = plan_tools(request.tools, request.tool_choice,
                           self.options.enable_auto_tool_choice, self.options.tool_call_parser)
        prompt = await self.render(request, tools)
        ids = self.truncate(await self.encode(prompt, request.add_special_tokens), request)
        max_tokens = self.check_length(len(ids), request.requested_max_tokens, what="messages")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(request, max_tokens, logprobs, request.prompt_logprobs,
                                      tool_structured=tools.structured if tools else None)
        if tools is not None and tools.mode == "auto" and params.skip_special_tokens \
                and self._tool_tags_are_special():
            params.skip_special_tokens = False  # the parser must see <tool_call> (as vLLM)
        phase = CONTENT
        if self.reasoning is not None:
            phase = self.reasoning.start_phase(ids)
            if params.structured_outputs is not None:  # the grammar starts after the reasoning
                params._think_tags = self.reasoning.think_tags(phase)
            if self.reasoning.tags_are_special and params.skip_special_tokens:
                params.skip_special_tokens = False  # the parser must see the tags
        response_id = request.request_id or random_id("chatcmpl")
        await self.compile_grammar(params.structured_outputs)
        started = await self.start([(ids, params)], final_only=not request.stream)
        assembler = _ChatAssembler(self, request, model, response_id, len(ids), tools, phase)
        if request.stream:
            return StreamingResponse(assembler.events(self.merge(started)),
                                     media_type=MEDIA_TYPE, headers=HEADERS)
        return JSONResponse(await assembler.full(self.merge(started)))


    def _tool_tags_are_special(self) -> bool:
        added = getattr(self.tokenizer, "get_added_vocab", lambda: {})()
        return "<tool_call>" in added


class _ChatAssembler:
    def __init__(self, serving: OpenAIServing, request: ChatCompletionRequest, model: str,
                 response_id: str, prompt_tokens: int, tools: Optional[ToolPlan],
                 phase: str = CONTENT) -> None:
        self.s = serving
        self.tools = tools
        self._tool_states: dict[int, ChoiceTools] = {}
        self.reasoning = getattr(serving, "reasoning", None)  # a reasoning parser, or None
        self.phase = phase  # where the output begins: in reasoning, or not
        self._reasoning_streams: dict[int, ReasoningStream] = {}
        self.request = request
        self.model = model
        self.id = response_id
        self.created = now()
        self.prompt_tokens = prompt_tokens
        self.role = serving.options.response_role  # --response-role
        self.echo_prefix = self._echo_prefix()

    def _echo_prefix(self) -> str:
        """With echo (vLLM extension), a final assistant message being continued is repeated."""
        last = self.request.messages[-1]
        if not self.request.echo or last.role != self.role:
            return ""
        content = last.content
        if isinstance(content, list):
            return "\n".join(str(p.get("text", "")) for p in content)
        return content or ""

    def _logprobs(self, o: CompletionOutput, start: int) -> Optional[dict[str, Any]]:
        if not self.request.logprobs:
            return None
        return {"content": chat_logprobs(self.s.tokenizer, o.token_ids[start:],
                                         (o.logprobs or [])[start:],
                                         self.request.top_logprobs or 0,
                                         self.s.token_ids_as_text(self.request))}

    async def full(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> dict[str, Any]:
        final: Optional[RequestOutput] = None
        async for _, out in outputs:
            final = out
        assert final is not None
        choices = [self._full_choice(o) for o in sorted(final.outputs, key=lambda c: c.index)]
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        body = {"id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model, "choices": choices,
                "usage": usage(self.prompt_tokens, completion_tokens),
                "metrics": spec_metrics([final])}
        if self.request.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(
                self.s.tokenizer, final.prompt_logprobs, self.s.token_ids_as_text(self.request))
        return body

    def _full_choice(self, o: CompletionOutput) -> dict[str, Any]:
        reasoning, content = None, o.text
        if self.reasoning is not None:  # tool calls and the answer come after the reasoning
            reasoning, content = self.reasoning.extract(o.text, self.phase)
        finish_reason = o.finish_reason
        message: dict[str, Any] = {"role": self.role}
        if self.tools is not None:
            state = self.tools.choice_state()
            content, calls = state.message(content) if content is not None else (None, [])
            message["tool_calls"] = calls
            finish_reason = state.finish_reason(finish_reason)
        message["content"] = (self.echo_prefix + content) if content is not None \
            else (self.echo_prefix or None)
        if self.reasoning is not None:
            self._add_reasoning(message, reasoning)
        choice = {"index": o.index, "message": message, "logprobs": self._logprobs(o, 0),
                  "finish_reason": finish_reason, "stop_reason": o.stop_reason}
        if self.request.spec_decode_token_origin:
            choice.update(token_origin_fields(self.s.tokenizer, o, 0))
        return choice

    def _add_reasoning(self, message: dict[str, Any], reasoning: Optional[str]) -> None:
        """vLLM's `reasoning` field and its older name `reasoning_content` (both, as vLLM sends
        them since 0.11.1); left out with include_reasoning false."""
        if not self.request.include_reasoning:
            reasoning = None
        message["reasoning"] = message["reasoning_content"] = reasoning

    def _delta(self, index: int, text: str, finished: bool, prefix: str = "") -> dict[str, Any]:
        """The delta of new text (after an echoed `prefix`): the reasoning parser's split, then
        what the choice's tool state lets out of the content."""
        reasoning = ""
        if self.reasoning is not None:
            stream = self._reasoning_streams.setdefault(index, self.reasoning.stream(self.phase))
            reasoning, text = stream.feed(text)
            if finished:
                rest_reasoning, rest_text = stream.finish()
                reasoning, text = reasoning + rest_reasoning, text + rest_text
        text = prefix + text
        delta: dict[str, Any] = {}
        if reasoning and self.request.include_reasoning:
            self._add_reasoning(delta, reasoning)
        if self.tools is None:
            if text:
                delta["content"] = text
            return delta
        state = self._tool_states.setdefault(index, self.tools.choice_state())
        delta.update(state.feed(text))
        if finished:
            for key, value in state.finish().items():
                delta[key] = (delta.get(key, "") + value if key == "content"
                              else delta.get(key, []) + value)
        return delta

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices, **extra}

    async def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]
                     ) -> AsyncIterator[bytes]:
        n = self.request.n
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        done: set[int] = set()
        final: Optional[RequestOutput] = None
        include_usage = self.request.include_usage
        continuous = bool(self.request.stream_options
                          and self.request.stream_options.continuous_usage_stats)
        try:
            # Every choice opens with its role, as OpenAI streams it.
            for index in range(n):
                yield sse_event(self._chunk([{"index": index,
                                              "delta": {"role": self.role, "content": ""},
                                              "logprobs": None, "finish_reason": None}]))
            async for _, out in outputs:
                final = out
                for o in sorted(out.outputs, key=lambda c: c.index):
                    if o.index in done:
                        continue
                    first = o.index not in sent_text
                    text = o.text[sent_text.get(o.index, 0):]
                    prefix = self.echo_prefix if first else ""
                    if not text and not prefix and o.finish_reason is None:
                        continue  # text held back while a stop string may be forming
                    delta = self._delta(o.index, text, o.finish_reason is not None, prefix)
                    sent_text[o.index] = len(o.text)
                    if not delta and o.finish_reason is None:
                        continue  # held back by the tool parser (logprobs ride the next chunk)
                    start = sent_tokens.get(o.index, 0)
                    finish_reason = o.finish_reason
                    if self.tools is not None:
                        finish_reason = self._tool_states[o.index].finish_reason(finish_reason)
                    choice = {"index": o.index, "delta": delta,
                              "logprobs": self._logprobs(o, start),
                              "finish_reason": finish_reason, "stop_reason": o.stop_reason}
                    if self.request.spec_decode_token_origin:
                        choice.update(token_origin_fields(self.s.tokenizer, o, start))
                    sent_tokens[o.index] = len(o.token_ids)
                    extra: dict[str, Any] = {}
                    if o.finish_reason is not None:
                        done.add(o.index)
                        if len(done) == n and not include_usage:
                            extra["metrics"] = spec_metrics([final])
                    if continuous:
                        extra["usage"] = usage(self.prompt_tokens, sum(sent_tokens.values()))
                    yield sse_event(self._chunk([choice], **extra))
            if include_usage:
                completion_tokens = sum(len(o.token_ids) for o in final.outputs) if final else 0
                yield sse_event(self._chunk([], usage=usage(self.prompt_tokens,
                                                            completion_tokens),
                                            metrics=spec_metrics([final])))
        except OpenAIError as e:
            yield sse_error(e)
        yield DONE
