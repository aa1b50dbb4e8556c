"""Request models, logprob formatting and SSE framing (no engine needed)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from tandem.entrypoints.openai.logprobs import (MIN_LOGPROB, CompletionLogprobs, chat_logprobs,
                                                clamp)
from tandem.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                TokenizeRequest)
from tandem.entrypoints.openai.sse import DONE, parse_sse, sse_event
from tandem.outputs import Logprob


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_prompt_forms(prompt: Any) -> None:
    assert CompletionRequest(prompt=prompt).prompt == prompt


def test_unknown_fields_are_accepted() -> None:
    req = CompletionRequest(prompt="x", some_future_openai_field=1)
    assert req.max_tokens == 16 and req.n == 1


def test_stream_options_need_stream() -> None:
    with pytest.raises(ValidationError, match="stream=True"):
        CompletionRequest(prompt="x", stream_options={"include_usage": True})
    assert CompletionRequest(prompt="x", stream=True,
                             stream_options={"include_usage": True}).include_usage


@pytest.mark.parametrize("logprobs", [-2, -30])
def test_logprobs_range(logprobs: int) -> None:
    """The upper bound is the server's --max-logprobs, checked by the engine."""
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="x", logprobs=logprobs)
    assert CompletionRequest(prompt="x", logprobs=21).logprobs == 21


def test_chat_fields() -> None:
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x", "extra": 1}],
                                max_completion_tokens=5, max_tokens=9)
    assert req.requested_max_tokens == 5
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], logprobs=True,
                              top_logprobs=-2)
    with pytest.raises(ValidationError):
        TokenizeRequest()


def test_clamp() -> None:
    assert clamp(-math.inf) == MIN_LOGPROB and clamp(math.nan) == MIN_LOGPROB
    assert clamp(-0.5) == -0.5 and clamp(None) is None


class _Tok:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"<{token_id}>"


def test_completion_logprobs_offsets_continue_across_chunks() -> None:
    entries = [{0: Logprob(-0.1, 1, "aa"), 1: Logprob(-2.0, 2, "b")},
               {1: Logprob(-math.inf, 1, "bbb")}]
    builder = CompletionLogprobs(_Tok(), initial_offset=0)
    first = builder.build([0], entries[:1])
    second = builder.build([1], entries[1:])
    assert first["text_offset"] == [0] and second["text_offset"] == [2]
    assert first["top_logprobs"] == [{"aa": -0.1, "b": -2.0}]
    assert second["token_logprobs"] == [MIN_LOGPROB]
    no_lp = CompletionLogprobs(_Tok()).build([0, 1], [None, None])
    assert no_lp["token_logprobs"] == [None, None] and no_lp["tokens"] == ["a", "b"]


def test_chat_logprobs_exact_top_count() -> None:
    entry = {3: Logprob(-3.0, 3, "d"), 0: Logprob(-0.1, 1, "a"), 1: Logprob(-1.0, 2, "b")}
    content = chat_logprobs(_Tok(), [3], [entry], top_logprobs=2)
    assert content[0]["token"] == "d" and content[0]["bytes"] == [100]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["a", "b"]
    assert chat_logprobs(_Tok(), [3], [entry], top_logprobs=0)[0]["top_logprobs"] == []


def test_sse_round_trip() -> None:
    text = sse_event({"a": "é"}) + sse_event({"b": [1]}) + DONE
    assert text.startswith(b'data: {"a":"\xc3\xa9"}') and text.endswith(b"data: [DONE]\n\n")
    assert parse_sse(text) == parse_sse(text.decode()) == [{"a": "é"}, {"b": [1]}, "[DONE]"]
    # JSON has no NaN: null, never a bare NaN a strict client would refuse
    assert parse_sse(sse_event({"x": float("nan")})) == [{"x": None}]


def test_tokens_that_decode_alike_keep_distinct_keys() -> None:
    entry = {7: Logprob(-0.5, 1, "\ufffd"), 8: Logprob(-0.7, 2, "\ufffd"),
             9: Logprob(-0.9, 3, "x")}
    out = CompletionLogprobs(_Tok()).build([8], [entry])
    assert out["top_logprobs"] == [{"\ufffd": -0.5, "<8>": -0.7, "x": -0.9}]
    assert out["tokens"] == ["<8>"]
