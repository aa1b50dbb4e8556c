"""Speculative decoding through the server (checklist 53-57): the draft changes speed, never
output; statistics ride on every response and /metrics counts accepted draft tokens."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from entrypoints.server_helpers import ServerProcess

PROMPTS = ["The future of AI is", "Once upon a time", "Hello, my name is"]


def _accepted(srv: ServerProcess) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith("tandem:spec_decode_num_accepted_tokens_total{"):
            return float(line.split()[-1])
    raise AssertionError("no tandem:spec_decode_num_accepted_tokens_total in /metrics")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_and_logprobs_match_plain(client: openai.OpenAI, server: ServerProcess,
                                                spec_client: openai.OpenAI,
                                                spec_server: ServerProcess, prompt: str) -> None:
    kwargs = dict(prompt=prompt, temperature=0, max_tokens=12, logprobs=3)
    plain = client.completions.create(model=server.model, **kwargs)
    spec = spec_client.completions.create(model=spec_server.model, **kwargs)
    p, s = plain.choices[0], spec.choices[0]
    assert s.text == p.text and s.logprobs.tokens == p.logprobs.tokens            # 53
    assert spec.usage == plain.usage and spec.usage.completion_tokens == 12       # 54
    for a, b in zip(p.logprobs.token_logprobs, s.logprobs.token_logprobs):        # 57
        assert math.isclose(a, b, abs_tol=1e-3), (a, b)
    stats = spec.model_extra["metrics"]["speculative_decoding"]
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_draft_tokens"] > 0
    assert plain.model_extra["metrics"]["speculative_decoding"] is None


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 7])
def test_max_tokens_never_overshot(spec_client: openai.OpenAI, spec_server: ServerProcess,
                                   max_tokens: int) -> None:
    r = spec_client.completions.create(model=spec_server.model, prompt=PROMPTS[0],
                                       temperature=0, max_tokens=max_tokens, logprobs=0)
    assert r.usage.completion_tokens == max_tokens == len(r.choices[0].logprobs.tokens)  # 55
    assert r.choices[0].finish_reason == "length"


def test_chunks_carry_several_tokens_and_finish_once(spec_client: openai.OpenAI,
                                                     spec_server: ServerProcess) -> None:
    chunks = list(spec_client.completions.create(model=spec_server.model, prompt=PROMPTS[1],
                                                 temperature=0, max_tokens=16, logprobs=0,
                                                 stream=True))
    tokens_per_chunk = [len(c.choices[0].logprobs.tokens) for c in chunks]
    assert max(tokens_per_chunk) > 1 and sum(tokens_per_chunk) == 16              # 56
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0


def test_metrics_show_accepted_tokens_rising(spec_client: openai.OpenAI,
                                             spec_server: ServerProcess) -> None:
    before = _accepted(spec_server)
    spec_client.completions.create(model=spec_server.model, prompt=PROMPTS[2], temperature=0,
                                   max_tokens=10)
    after = _accepted(spec_server)
    assert after > before
    text = httpx.get(spec_server.url + "/metrics").text
    assert "tandem:spec_decode_num_draft_tokens_total{" in text


def test_served_model_aliases(spec_client: openai.OpenAI, spec_server: ServerProcess) -> None:
    models = spec_client.models.list().data
    assert [m.id for m in models] == ["tiny-spec", "tiny-alias"]
    assert spec_client.completions.create(model="tiny-alias", prompt=PROMPTS[0],
                                          max_tokens=2).usage.completion_tokens == 2
