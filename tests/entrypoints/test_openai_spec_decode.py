"""Speculative decoding through the server (checklist 53-57): the draft changes speed, never
output; statistics ride on every response and /metrics counts accepted draft tokens. Each test runs
with a same-vocabulary draft and with a draft of another tokenizer (TLI)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from entrypoints.server_helpers import ServerProcess, client_for

PROMPTS = ["The future of AI is", "Once upon a time", "Hello, my name is"]


@pytest.fixture(scope="module", params=["spec", "tli"])
def draft_server(request: pytest.FixtureRequest) -> ServerProcess:
    return request.getfixturevalue("spec_server" if request.param == "spec" else "tli_server")


@pytest.fixture(scope="module")
def draft_client(draft_server: ServerProcess) -> openai.OpenAI:
    return client_for(draft_server)


def _accepted(srv: ServerProcess) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith("tandem:spec_decode_num_accepted_tokens_total{"):
            return float(line.split()[-1])
    raise AssertionError("no tandem:spec_decode_num_accepted_tokens_total in /metrics")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_and_logprobs_match_plain(client: openai.OpenAI, server: ServerProcess,
                                                draft_client: openai.OpenAI,
                                                draft_server: ServerProcess, prompt: str) -> None:
    kwargs = dict(prompt=prompt, temperature=0, max_tokens=12, logprobs=3)
    plain = client.completions.create(model=server.model, **kwargs)
    spec = draft_client.completions.create(model=draft_server.model, **kwargs)
    p, s = plain.choices[0], spec.choices[0]
    assert s.text == p.text and s.logprobs.tokens == p.logprobs.tokens            # 53
    assert spec.usage == plain.usage and spec.usage.completion_tokens == 12       # 54
    for a, b in zip(p.logprobs.token_logprobs, s.logprobs.token_logprobs):        # 57
        assert math.isclose(a, b, abs_tol=1e-3), (a, b)
    stats = spec.model_extra["metrics"]["speculative_decoding"]
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_draft_tokens"] > 0
    assert plain.model_extra["metrics"]["speculative_decoding"] is None


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 7])
def test_max_tokens_never_overshot(draft_client: openai.OpenAI, draft_server: ServerProcess,
                                   max_tokens: int) -> None:
    r = draft_client.completions.create(model=draft_server.model, prompt=PROMPTS[0],
                                       temperature=0, max_tokens=max_tokens, logprobs=0)
    assert r.usage.completion_tokens == max_tokens == len(r.choices[0].logprobs.tokens)  # 55
    assert r.choices[0].finish_reason == "length"


def test_chunks_carry_several_tokens_and_finish_once(draft_client: openai.OpenAI,
                                                     draft_server: ServerProcess) -> None:
    chunks = list(draft_client.completions.create(model=draft_server.model, prompt=PROMPTS[1],
                                                 temperature=0, max_tokens=16, logprobs=0,
                                                 stream=True))
    tokens_per_chunk = [len(c.choices[0].logprobs.tokens) for c in chunks]
    assert max(tokens_per_chunk) > 1 and sum(tokens_per_chunk) == 16              # 56
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0


def test_metrics_show_accepted_tokens_rising(draft_client: openai.OpenAI,
                                             draft_server: ServerProcess) -> None:
    before = _accepted(draft_server)
    draft_client.completions.create(model=draft_server.model, prompt=PROMPTS[2], temperature=0,
                                   max_tokens=10)
    after = _accepted(draft_server)
    assert after > before
    text = httpx.get(draft_server.url + "/metrics").text
    assert "tandem:spec_decode_num_draft_tokens_total{" in text


def test_streamed_chat_matches_plain(client: openai.OpenAI, server: ServerProcess,
                                     draft_client: openai.OpenAI,
                                     draft_server: ServerProcess) -> None:
    """Chat templates put special tokens in the prompt; a TLI draft reads them as text."""
    messages = [{"role": "user", "content": "Explain to a ten-year-old why the sky is blue."}]
    plain = client.chat.completions.create(model=server.model, messages=messages,
                                           temperature=0, max_tokens=20)
    chunks = draft_client.chat.completions.create(model=draft_server.model, messages=messages,
                                                  temperature=0, max_tokens=20, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content


def test_served_model_aliases(spec_client: openai.OpenAI, spec_server: ServerProcess) -> None:
    models = spec_client.models.list().data
    assert [m.id for m in models] == ["tiny-spec", "tiny-alias"]
    assert spec_client.completions.create(model="tiny-alias", prompt=PROMPTS[0],
                                          max_tokens=2).usage.completion_tokens == 2
