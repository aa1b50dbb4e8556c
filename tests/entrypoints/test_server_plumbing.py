"""The HTTP layer over a fake engine, in-process: response shapes, streaming, errors and their
statuses, aborts on disconnect, and survival of engine failures. Fast; no model is loaded."""

from __future__ import annotations

import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from tandem.entrypoints.openai.sse import parse_sse


@pytest.fixture(scope="module")
def oa(fake_server: Any) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(api_key="EMPTY", base_url=fake_server.url + "/v1", max_retries=0)
    yield client
    client.close()  # an open keep-alive connection would delay the server's shutdown


def test_models_and_completion_shape(oa: openai.OpenAI) -> None:
    assert [m.id for m in oa.models.list().data] == ["fake-model"]
    c = oa.completions.create(model="fake-model", prompt="Hello there", max_tokens=5,
                              temperature=0)
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 5
    spec = c.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] > 0 and spec["num_accepted_draft_tokens"] > 0


def test_stream_equals_non_stream_and_carries_metrics(oa: openai.OpenAI) -> None:
    kwargs = dict(model="fake-model", prompt="Hello there", max_tokens=7, temperature=0)
    full = oa.completions.create(**kwargs).choices[0].text
    chunks = list(oa.completions.create(stream=True, stream_options={"include_usage": True},
                                        **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"] is not None


def test_batch_n_logprobs_echo(oa: openai.OpenAI) -> None:
    c = oa.completions.create(model="fake-model", prompt=[[5, 6, 7], [8, 9]], n=2, max_tokens=3,
                              temperature=0, logprobs=2, echo=True)
    assert [ch.index for ch in c.choices] == [0, 1, 2, 3]
    lp = c.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 3 + 3
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_stream_roles_and_finish(oa: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    full = oa.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4,
                                      temperature=0)
    chunks = list(oa.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4,
                                             temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1


@pytest.mark.parametrize("body,status", [
    ({"prompt": ""}, 400), ({"prompt": []}, 400), ({"prompt": [999999]}, 400),
    ({"prompt": [-1]}, 400), ({"prompt": "x", "logprobs": 21}, 400),
    ({"prompt": "x", "seed": 2**64}, 400), ({"prompt": "x", "temperature": 5}, 400),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, 400), ({"prompt": "x", "model": "nope"}, 404),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400),
    ({"prompt": "x", "max_tokens": 1000}, 400), ({"prompt": [5] * 200}, 400),
])
def test_error_statuses_and_shape(fake_server: Any, body: dict, status: int) -> None:
    r = httpx.post(fake_server.url + "/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status


@pytest.mark.parametrize("raw,headers", [
    ('"a string"', {}), ("[1]", {}), ("42", {}), ("null", {}), ("{bad", {}),
    ("prompt=x", {"content-type": "application/x-www-form-urlencoded"})])
def test_bad_bodies_are_4xx(fake_server: Any, raw: str, headers: dict) -> None:
    r = httpx.post(fake_server.url + "/v1/completions", content=raw,
                   headers={"content-type": "application/json", **headers})
    assert 400 <= r.status_code < 500 and "error" in r.json()


def test_engine_failure_is_500_then_server_recovers(fake_server: Any, oa: openai.OpenAI) -> None:
    fake_server.fake.fail_next_step = True
    with pytest.raises(openai.InternalServerError):
        oa.completions.create(model="fake-model", prompt="Hello", max_tokens=3)
    fake_server.fake.fail_next_step = True
    r = httpx.post(fake_server.url + "/v1/completions",
                   json={"prompt": "Hello", "max_tokens": 3, "stream": True})
    events = parse_sse(r.text)
    assert "error" in events[-2] and events[-1] == "[DONE]"
    assert oa.completions.create(model="fake-model", prompt="Hello", max_tokens=3) \
        .choices[0].finish_reason == "length"


def _free_blocks(url: str) -> int:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("tandem:kv_cache_free_blocks{"):
            return int(float(line.split()[-1]))
    raise AssertionError("no kv_cache_free_blocks gauge")


def test_dropped_stream_and_timed_out_request_free_blocks(fake_server: Any) -> None:
    total = fake_server.fake.num_blocks
    fake_server.fake.step_delay = 0.02
    try:
        body = {"prompt": "Hello", "max_tokens": 100, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", fake_server.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # keep a reference: a collected iterator closes the stream
            next(lines)
            assert _free_blocks(fake_server.url) < total  # the request holds blocks
        with pytest.raises(httpx.TimeoutException):
            httpx.post(fake_server.url + "/v1/completions", timeout=0.1,
                       json={"prompt": "Hello", "max_tokens": 100, "ignore_eos": True})
        deadline = time.monotonic() + 10
        while _free_blocks(fake_server.url) != total:
            assert time.monotonic() < deadline, "blocks of dropped requests were not freed"
            time.sleep(0.05)
        assert fake_server.engine.num_in_flight == 0 and not fake_server.fake.requests
    finally:
        fake_server.fake.step_delay = 0.0


def test_continuous_usage_stats(fake_server: Any) -> None:
    r = httpx.post(fake_server.url + "/v1/completions",
                   json={"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True,
                         "stream_options": {"include_usage": True,
                                            "continuous_usage_stats": True}})
    chunks = [e for e in parse_sse(r.text) if e != "[DONE]"]
    assert all(c["usage"]["prompt_tokens"] > 0 for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_unsupported_options_are_400_not_ignored(fake_server: Any) -> None:
    import dataclasses

    from tandem.sampling_params import SamplingParams
    unsupported = [{"suffix": "x"}, {"use_beam_search": True}, {"best_of": 3},
                   {"response_format": {"type": "structural_tag"}}, {"length_penalty": 1.0},
                   {"priority": 1}, {"guided_decoding_backend": "xgrammar"}]
    if "logit_bias" not in {f.name for f in dataclasses.fields(SamplingParams)}:
        unsupported.append({"logit_bias": {"5": 1.0}})  # until the sampler supports it
    for extra in unsupported:
        r = httpx.post(fake_server.url + "/v1/completions",
                       json={"prompt": "Hello", "max_tokens": 2, **extra})
        assert r.status_code == 400, (extra, r.text)


def test_image_part_is_400_naming_the_part(fake_server: Any) -> None:
    """Every model is served as text: an image part is the client's error, named; text parts
    in a list still work."""
    text = {"type": "text", "text": "Describe"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = httpx.post(fake_server.url + "/v1/chat/completions",
                   json={"model": "fake-model", "max_tokens": 2,
                         "messages": [{"role": "user", "content": [text, image]}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].type"
    assert "'image_url'" in error["message"] and "text only" in error["message"]
    ok = httpx.post(fake_server.url + "/v1/chat/completions",
                    json={"model": "fake-model", "max_tokens": 2,
                          "messages": [{"role": "user", "content": [text, text]}]})
    assert ok.status_code == 200, ok.text
