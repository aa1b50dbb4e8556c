"""Pydantic request models of the OpenAI-compatible API (OpenAI's fields plus vLLM's extensions).

Unknown fields are kept by the models (`model_extra`); the serving code answers 400 naming them,
except OpenAI's fields that change nothing here, which are logged (request_params.py). Responses
are built as plain dicts by the serving modules.

JSON may escape a lone UTF-16 surrogate (`"\\ud800"`), which decodes to a Python string that no
tokenizer, and no UTF-8 encoder, accepts: every request body is checked for them first, and one
found anywhere is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


Prompt = Union[str, list[str], list[int], list[list[int]]]


def _surrogate_path(value: Any, path: str) -> Optional[str]:
    """The dotted path of the first string (key or value) holding a lone surrogate, if any."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")  # fails exactly on lone surrogates; C speed on megabytes
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _surrogate_path(key, where):
                return where
            found = _surrogate_path(item, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _surrogate_path(item, f"{path}[{i}]")
            if found:
                return found
    return None


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        where = _surrogate_path(data, "")
        if where is not None:
            where = where.encode("utf-8", "backslashreplace").decode("utf-8")  # keys may hold one
            raise ValueError(f"{where} contains a lone UTF-16 surrogate (an invalid \\uD800-"
                             "\\uDFFF escape); send valid Unicode text")
        return data


class StreamOptions(OpenAIBaseModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class JsonSchemaFormat(OpenAIBaseModel):
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(OpenAIBaseModel):
    type: str = "text"  # text | json_object | json_schema
    json_schema: Optional[JsonSchemaFormat] = None


class SamplingFields(OpenAIBaseModel):
    """Fields shared by completions and chat that become SamplingParams."""
    model: Optional[str] = None
    n: int = 1
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    frequency_penalty: Optional[float] = 0.0
    presence_penalty: Optional[float] = 0.0
    logit_bias: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # vLLM extensions
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: Optional[int] = None
    use_beam_search: bool = False
    best_of: Optional[int] = None
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    request_id: Optional[str] = None
    # structured outputs (vLLM), and vLLM's older guided_* spellings of the same
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_decoding_backend: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    return_tokens_as_token_ids: Optional[bool] = None
    truncate_prompt_tokens: Optional[int] = None
    # tandem's extension: each token's origin under speculation (openai/token_origin.py)
    spec_decode_token_origin: bool = False
    # tandem's extension: speculation off for this request, or capped at k drafts per step
    disable_spec_decode: bool = False
    num_speculative_tokens: Optional[int] = None

    @model_validator(mode="after")
    def _check_stream_options(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Optional[Prompt] = None
    echo: bool = False
    logprobs: Optional[int] = None
    max_tokens: Optional[int] = 16
    suffix: Optional[str] = None
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _check_logprobs(self) -> CompletionRequest:
        if self.logprobs is not None and not (self.logprobs == -1 or self.logprobs >= 0):
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}")
        return self


class ChatMessage(OpenAIBaseModel):
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None   # an assistant's earlier calls
    tool_call_id: Optional[str] = None                  # a tool result's call


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    # vLLM extensions
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    include_reasoning: bool = True  # with --reasoning-parser: false leaves the reasoning out

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None:
            if not (self.top_logprobs == -1 or self.top_logprobs >= 0):
                raise ValueError(f"top_logprobs must be non-negative or -1, got "
                                 f"{self.top_logprobs}")
            if not self.logprobs and self.top_logprobs > 0:
                raise ValueError("when using `top_logprobs`, `logprobs` must be set to true")
        return self

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


class TokenizeRequest(OpenAIBaseModel):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: Optional[bool] = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


class DetokenizeRequest(OpenAIBaseModel):
    model: Optional[str] = None
    tokens: list[int]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[int] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo

