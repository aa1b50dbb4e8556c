"""A request's fields to SamplingParams: sampling fields (with the generation config's defaults for
omitted ones), logit bias, structured outputs from any of vLLM's spellings, prompt truncation,
and the policy for fields the server does not implement (a 400 naming them, never silence)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Optional

from tandem.entrypoints.openai.errors import OpenAIError
from tandem.entrypoints.openai.protocol import SamplingFields
from tandem.sample.structured_params import StructuredOutputsParams
from tandem.sampling_params import SamplingParams

logger = logging.getLogger("tandem.server")
_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# Fields OpenAI defines that change nothing on this server: accepted, with a logged warning.
OPENAI_NO_OP_FIELDS = frozenset({
    "metadata", "store", "service_tier", "parallel_tool_calls", "modalities", "audio",
    "prediction", "web_search_options", "safety_identifier", "prompt_cache_key", "verbosity",
    "reasoning_effort", "top_a"})
_GRAMMAR_BACKENDS = (None, "auto", "guidance", "llguidance")


class RequestParams:
    """Mixed into the serving classes, which provide vocab_size, defaults and options."""

    vocab_size: int
    defaults: dict[str, Any]
    options: Any

    def _logit_bias(self, request: SamplingFields) -> Optional[dict[int, float]]:
        if not request.logit_bias:
            return None
        bias: dict[int, float] = {}
        for key, value in request.logit_bias.items():
            try:
                token_id = int(key)
            except (TypeError, ValueError):
                raise OpenAIError(f"logit_bias keys must be token ids (integers), got {key!r}",
                                  param="logit_bias") from None
            if not 0 <= token_id < self.vocab_size:
                raise OpenAIError(f"logit_bias token id {token_id} is out of vocabulary "
                                  f"(vocab size {self.vocab_size})", param="logit_bias")
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise OpenAIError(f"logit_bias values must be numbers, got {value!r} for token "
                                  f"{token_id}", param="logit_bias")
            bias[token_id] = max(-100.0, min(100.0, float(value)))
        return bias

    def _check_unsupported(self, request: SamplingFields, extra: dict[str, Any]) -> None:
        if request.use_beam_search:
            raise OpenAIError("beam search is not supported", param="use_beam_search")
        if request.best_of is not None and request.best_of > 1 and request.best_of != request.n:
            raise OpenAIError("best_of is not supported (use n)", param="best_of")
        for name, value in extra.items():
            if value and name not in _PARAM_FIELDS:
                raise OpenAIError(f"{name} is not supported by this server", param=name)
        self._check_extra_fields(request)

    def _check_extra_fields(self, request: SamplingFields) -> None:
        """Fields the request models do not declare: OpenAI's no-ops are logged, anything else
        is a 400 naming it (never silent success)."""
        for name in sorted(request.model_extra or {}):
            if name in OPENAI_NO_OP_FIELDS:
                logger.warning("request field %r has no effect on this server; ignored", name)
                continue
            raise OpenAIError(f"Unsupported request field {name!r}: this server does not "
                              "implement it.", param=name)

    def structured_outputs(self, request: SamplingFields,
                           tool_structured: Optional[StructuredOutputsParams] = None
                           ) -> Optional[StructuredOutputsParams]:
        """structured_outputs, vLLM's guided_* fields, response_format, or a required/named
        tool_choice: at most one."""
        if request.guided_decoding_backend not in _GRAMMAR_BACKENDS:
            raise OpenAIError(f"guided_decoding_backend {request.guided_decoding_backend!r} is "
                              "not available: this server uses llguidance (or 'auto').",
                              param="guided_decoding_backend")
        sources: list[tuple[str, dict[str, Any]]] = []
        if request.structured_outputs is not None:
            sources.append(("structured_outputs", dict(request.structured_outputs)))
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"),
                          ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            value = getattr(request, name)
            if value is not None:
                sources.append((name, {key: value}))
        fmt = request.response_format
        if fmt is not None and fmt.type != "text":
            if fmt.type == "json_object":
                sources.append(("response_format", {"json_object": True}))
            elif fmt.type == "json_schema":
                schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
                if not isinstance(schema, dict):
                    raise OpenAIError("response_format json_schema needs json_schema.schema",
                                      param="response_format")
                sources.append(("response_format", {"json": schema}))
            else:
                raise OpenAIError(f"response_format type {fmt.type!r} is not supported; "
                                  "supported: text, json_object, json_schema",
                                  param="response_format")
        if tool_structured is not None:
            if sources:
                raise OpenAIError("tool_choice 'required' or a named tool constrains the output; "
                                  f"it cannot be combined with {sources[0][0]}",
                                  param=sources[0][0])
            return tool_structured
        if not sources:
            return None
        if len(sources) > 1:
            raise OpenAIError("Only one kind of structured output per request: got "
                              f"{[n for n, _ in sources]}.", param=sources[1][0])
        name, fields = sources[0]
        if request.guided_whitespace_pattern is not None:
            fields["whitespace_pattern"] = request.guided_whitespace_pattern
        try:
            return StructuredOutputsParams.from_dict(fields)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), param=name) from None

    def _default(self, request: SamplingFields, name: str, fallback: Any) -> Any:
        """The request's value; if it sent none, the generation config's, then `fallback`."""
        value = getattr(request, name)
        if name in request.model_fields_set and value is not None:
            return value
        return self.defaults.get(name, fallback if value is None else value)

    def sampling_params(self, request: SamplingFields, max_tokens: int,
                        logprobs: Optional[int], prompt_logprobs: Optional[int],
                        tool_structured: Optional[StructuredOutputsParams] = None
                        ) -> SamplingParams:
        extra = {"logit_bias": self._logit_bias(request),
                 "allowed_token_ids": request.allowed_token_ids, "bad_words": request.bad_words}
        self._check_unsupported(request, extra)
        kwargs: dict[str, Any] = dict(
            n=request.n, seed=request.seed, stop=request.stop,
            stop_token_ids=request.stop_token_ids, max_tokens=max_tokens,
            temperature=self._default(request, "temperature", 1.0),
            top_p=self._default(request, "top_p", 1.0),
            top_k=self._default(request, "top_k", 0) or 0,
            min_p=self._default(request, "min_p", 0.0) or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=self._default(request, "repetition_penalty", 1.0),
            ignore_eos=request.ignore_eos, min_tokens=request.min_tokens,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output,
            disable_spec_decode=request.disable_spec_decode,
            num_speculative_tokens=request.num_speculative_tokens,
            structured_outputs=self.structured_outputs(request, tool_structured))
        kwargs.update({k: v for k, v in extra.items() if v})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e)) from None

    def token_ids_as_text(self, request: SamplingFields) -> bool:
        """Logprob tokens as "token_id:N" (vLLM's return_tokens_as_token_ids)."""
        if request.return_tokens_as_token_ids is not None:
            return request.return_tokens_as_token_ids
        return self.options.return_tokens_as_token_ids

    def truncate(self, ids: list[int], request: SamplingFields) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the last N prompt tokens."""
        n = request.truncate_prompt_tokens
        if n is None:
            return ids
        if n < 1:
            raise OpenAIError(f"truncate_prompt_tokens must be at least 1, got {n}",
                              param="truncate_prompt_tokens")
        return ids[-n:]

