"""/v1/chat/completions against a real `tandem serve`, without and with speculative decoding
(conformance checklist items 36-48)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from entrypoints.server_helpers import ServerProcess
from tandem.entrypoints.chat_utils import apply_chat_template

MESSAGES = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "What is the capital of France?"}]


def _prompt_tokens(tokenizer: Any, messages: list[dict]) -> int:
    return len(tokenizer(apply_chat_template(tokenizer, messages),
                         add_special_tokens=False).input_ids)


def test_chat_shape_and_usage(oa: openai.OpenAI, srv: ServerProcess, tokenizer: Any) -> None:
    r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, temperature=0,
                                   max_completion_tokens=5)                   # 36
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length" and r.object == "chat.completion"
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == _prompt_tokens(tokenizer, MESSAGES)       # 45
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    assert "speculative_decoding" in r.model_extra["metrics"]
    legacy = oa.chat.completions.create(model=srv.model, messages=MESSAGES, temperature=0,
                                        max_tokens=5)                         # 37
    assert legacy.choices[0].message.content == choice.message.content
    assert legacy.usage.completion_tokens == 5


def test_chat_streaming(oa: openai.OpenAI, srv: ServerProcess) -> None:
    kwargs = dict(model=srv.model, messages=MESSAGES, temperature=0, max_tokens=6)
    full = oa.chat.completions.create(**kwargs)
    chunks = list(oa.chat.completions.create(stream=True, **kwargs))        # 38
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    chunks = list(oa.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                             **kwargs))                       # 41
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert "speculative_decoding" in chunks[-1].model_extra["metrics"]


def test_chat_logprobs(oa: openai.OpenAI, srv: ServerProcess) -> None:
    kwargs = dict(model=srv.model, messages=MESSAGES, temperature=0, max_tokens=4)
    assert oa.chat.completions.create(logprobs=False, **kwargs).choices[0].logprobs is None  # 39
    zero = oa.chat.completions.create(logprobs=True, top_logprobs=0, **kwargs).choices[0]
    assert zero.logprobs.content[0].top_logprobs == []
    five = oa.chat.completions.create(logprobs=True, top_logprobs=5, **kwargs).choices[0]
    assert len(five.logprobs.content) == 4
    for item in five.logprobs.content:
        assert len(item.top_logprobs) == 5
        assert item.logprob >= -9999.0 and all(t.logprob >= -9999.0 for t in item.top_logprobs)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token     # 40
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(logprobs=True, top_logprobs=21, **kwargs)
    streamed = [c for c in oa.chat.completions.create(logprobs=True, top_logprobs=2,
                                                      stream=True, **kwargs)
                if c.choices[0].logprobs]
    assert sum(len(c.choices[0].logprobs.content) for c in streamed) == 4


def test_chat_n_and_content_forms(oa: openai.OpenAI, srv: ServerProcess) -> None:
    r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, n=3, temperature=1.0,
                                   seed=1, max_tokens=4)                       # 42
    assert [c.index for c in r.choices] == [0, 1, 2]
    chunks = list(oa.chat.completions.create(model=srv.model, messages=MESSAGES, n=2,
                                             temperature=1.0, max_tokens=4, stream=True))
    for i in range(2):
        assert "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices[0].index == i)
    plain = oa.chat.completions.create(model=srv.model, messages=MESSAGES, temperature=0,
                                       max_tokens=5)
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
             for m in MESSAGES]
    as_parts = oa.chat.completions.create(model=srv.model, messages=parts, temperature=0,
                                          max_tokens=5)                        # 43
    assert as_parts.choices[0].message.content == plain.choices[0].message.content
    weird = [{**MESSAGES[0], "unknown_key": {"x": [1]}}, MESSAGES[1]]
    r = httpx.post(srv.base_url + "/chat/completions",
                   json={"model": srv.model, "messages": weird, "max_tokens": 2})
    assert r.status_code == 200, r.text                                       # 44


def test_multi_turn_and_response_format(oa: openai.OpenAI, srv: ServerProcess,
                                        tokenizer: Any) -> None:
    turns = MESSAGES + [{"role": "assistant", "content": "Paris."},
                        {"role": "user", "content": "And Japan?"}]
    r = oa.chat.completions.create(model=srv.model, messages=turns, temperature=0, max_tokens=3,
                                   response_format={"type": "text"})          # 45, 47
    assert r.usage.prompt_tokens == _prompt_tokens(tokenizer, turns)
    with pytest.raises(openai.BadRequestError):                               # 46
        oa.chat.completions.create(model=srv.model, max_tokens=3,
                                   messages=[{"role": "user", "content": "word " * 400}])


def test_continue_final_message_echo(srv: ServerProcess) -> None:
    prefix = "The capital is"
    body = {"model": srv.model, "temperature": 0, "max_tokens": 4,
            "messages": MESSAGES + [{"role": "assistant", "content": prefix}],
            "add_generation_prompt": False, "continue_final_message": True}  # 48
    plain = httpx.post(srv.base_url + "/chat/completions", json=body).json()
    echoed = httpx.post(srv.base_url + "/chat/completions", json={**body, "echo": True}).json()
    text = plain["choices"][0]["message"]["content"]
    assert not text.startswith(prefix)
    assert echoed["choices"][0]["message"]["content"] == prefix + text
