"""POST /v1/completions: prompts (text, token ids, or batches of either) -> `text_completion`
responses or an SSE stream of chunks.

A batch of P prompts with n choices each becomes P engine requests; choice index is
prompt_index * n + choice_index (prompt-major, as vLLM orders them).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import JSONResponse, StreamingResponse

from tandem.entrypoints.openai.errors import OpenAIError, sse_error
from tandem.entrypoints.openai.logprobs import (CompletionLogprobs, merge_completion_logprobs,
                                                prompt_logprobs_json)
from tandem.entrypoints.openai.protocol import CompletionRequest
from tandem.entrypoints.openai.serving_engine import (OpenAIServing, now, random_id,
                                                      spec_metrics, usage)
from tandem.entrypoints.openai.sse import DONE, HEADERS, MEDIA_TYPE, sse_event
from tandem.entrypoints.openai.token_origin import token_origin_fields
from tandem.outputs import CompletionOutput, RequestOutput

PromptInput = tuple[str, list[int]]  # (text for echo, token ids)


class OpenAIServingCompletion(OpenAIServing):

    async def _prompts(self, request: CompletionRequest) -> list[PromptInput]:
        prompt = request.prompt
        if prompt is None or (isinstance(prompt, list) and not prompt):
            raise OpenAIError("Either prompt or prompt_embeds must be provided and non-empty.",
                              param="prompt")
        items: list[Union[str, list[int]]]
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            items = [prompt]  # type: ignore[list-item]
        else:
            items = list(prompt)  # type: ignore[arg-type]
        out: list[PromptInput] = []
        for item in items:
            if isinstance(item, str):
                ids = self.truncate(await self.encode(item, request.add_special_tokens), request)
            else:
                ids = self.truncate(self.check_token_ids(item), request)
            out.append((item if isinstance(item, str) and request.truncate_prompt_tokens is None
                        else await asyncio.to_thread(self.tokenizer.decode, ids), ids))
        return out

    async def create(self, request: CompletionRequest) -> Union[JSONResponse, StreamingResponse]:
        model = self.check_model(request.model)
        if request.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        prompts = await self._prompts(request)
        # Echo with logprobs needs the prompt's logprobs too.
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None:
            prompt_logprobs = request.logprobs
        base_id = request.request_id or random_id("cmpl")
        jobs = []
        for _, ids in prompts:
            max_tokens = self.check_length(len(ids), request.max_tokens)
            params = self.sampling_params(request, max_tokens, request.logprobs, prompt_logprobs)
            jobs.append((ids, params))
        await self.compile_grammar(jobs[0][1].structured_outputs)
        started = await self.start(jobs, final_only=not request.stream)
        stream = _Assembler(self, request, model, base_id, prompts)
        if request.stream:
            return StreamingResponse(stream.events(self.merge(started)), media_type=MEDIA_TYPE,
                                     headers=HEADERS)
        return JSONResponse(await stream.full(self.merge(started)))


class _Assembler:
    """Turns cumulative engine outputs into one response or a sequence of deltas."""

    def __init__(self, serving: OpenAIServing, request: CompletionRequest, model: str,
                 response_id: str, prompts: list[PromptInput]) -> None:
        self.s = serving
        self.request = request
        self.model = model
        self.id = response_id
        self.created = now()
        self.prompts = prompts
        self.n = request.n
        self.prompt_tokens = sum(len(ids) for _, ids in prompts)
        self.as_ids = serving.token_ids_as_text(request)

    def _builder(self) -> CompletionLogprobs:
        return CompletionLogprobs(self.s.tokenizer, as_token_ids=self.as_ids)

    def _choice_logprobs(self, builder: CompletionLogprobs, out: RequestOutput,
                         o: CompletionOutput, start: int, with_prompt: bool) -> Optional[dict]:
        if self.request.logprobs is None:
            return None
        parts = []
        if with_prompt:
            ids = out.prompt_token_ids
            parts.append(builder.build(ids, out.prompt_logprobs or [None] * len(ids)))
        parts.append(builder.build(o.token_ids[start:], (o.logprobs or [])[start:]))
        return merge_completion_logprobs(parts)

    async def full(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> dict[str, Any]:
        final: list[Optional[RequestOutput]] = [None] * len(self.prompts)
        async for i, out in outputs:
            final[i] = out
        choices = []
        for i, out in enumerate(final):
            assert out is not None
            for o in sorted(out.outputs, key=lambda c: c.index):
                text = (self.prompts[i][0] + o.text) if self.request.echo else o.text
                builder = self._builder()
                choice = {"index": i * self.n + o.index, "text": text,
                          "logprobs": self._choice_logprobs(builder, out, o, 0, self.request.echo),
                          "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
                if self.request.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(
                        self.s.tokenizer, out.prompt_logprobs, self.as_ids)
                if self.request.spec_decode_token_origin:
                    choice.update(token_origin_fields(self.s.tokenizer, o, 0))
                choices.append(choice)
        completion_tokens = sum(len(o.token_ids) for out in final if out for o in out.outputs)
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices,
                "usage": usage(self.prompt_tokens, completion_tokens),
                "metrics": spec_metrics(final)}

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices, **extra}

    async def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]
                     ) -> AsyncIterator[bytes]:
        total = len(self.prompts) * self.n
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        builders: dict[int, CompletionLogprobs] = {}
        done: set[int] = set()
        final: list[Optional[RequestOutput]] = [None] * len(self.prompts)
        continuous = bool(self.request.stream_options
                          and self.request.stream_options.continuous_usage_stats)
        try:
            async for i, out in outputs:
                final[i] = out
                for o in sorted(out.outputs, key=lambda c: c.index):
                    index = i * self.n + o.index
                    if index in done:
                        continue
                    first = index not in sent_tokens
                    text = o.text[sent_text.get(index, 0):]
                    echo = first and self.request.echo
                    if echo:
                        text = self.prompts[i][0] + text
                    if not text and o.finish_reason is None:
                        continue  # tokens whose text is held back (possible stop string)
                    builder = builders.get(index)
                    if builder is None:
                        builder = builders[index] = self._builder()
                    start = sent_tokens.get(index, 0)
                    choice = {"index": index, "text": text,
                              "logprobs": self._choice_logprobs(builder, out, o, start, echo),
                              "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
                    if self.request.spec_decode_token_origin:
                        choice.update(token_origin_fields(self.s.tokenizer, o, start))
                    sent_text[index] = len(o.text)
                    sent_tokens[index] = len(o.token_ids)
                    extra: dict[str, Any] = {}
                    if o.finish_reason is not None:
                        done.add(index)
                        if len(done) == total and not self.request.include_usage:
                            extra["metrics"] = spec_metrics(final)
                    if continuous:
                        extra["usage"] = usage(self.prompt_tokens, sum(sent_tokens.values()))
                    yield sse_event(self._chunk([choice], **extra))
            if self.request.include_usage:
                completion_tokens = sum(len(o.token_ids) for out in final if out
                                        for o in out.outputs)
                yield sse_event(self._chunk([], usage=usage(self.prompt_tokens,
                                                            completion_tokens),
                                            metrics=spec_metrics(final)))
        except OpenAIError as e:
            yield sse_error(e)
        yield DONE
