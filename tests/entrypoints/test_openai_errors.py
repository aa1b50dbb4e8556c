"""Validation and errors against a real `tandem serve` (checklist items 26-35): statuses, the
OpenAI error shape, the openai client's exception classes, and that the server keeps serving."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from entrypoints.server_helpers import ServerProcess

PROMPT = "The future of AI is"


def _post(srv: ServerProcess, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(srv.base_url + "/completions", json=body, **kwargs)


def _assert_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]                                                  # 33
    assert set(error) >= {"message", "type", "param", "code"} and error["code"] == status
    for word in words:
        assert word in error["message"], error["message"]


@pytest.mark.parametrize("body,words", [
    ({"prompt": ""}, ["empty"]), ({"prompt": []}, []),                             # 26
    ({"prompt": [999999]}, ["out of vocabulary"]),                                  # 27
    ({"prompt": [[5, -1]]}, ["-1"]),                                                # 28
    ({"prompt": [5] * 300}, ["maximum context length", "256", "300"]),              # 29
    ({"prompt": PROMPT, "max_tokens": 250}, ["maximum context length", "256", "250"]),
    ({"prompt": PROMPT, "seed": 2**63}, ["seed"]),                                  # 30
    ({"prompt": PROMPT, "logit_bias": {"999999": 1}}, ["999999", "vocab"]),          # 31
    ({"prompt": PROMPT, "logit_bias": {"abc": 1}}, ["logit_bias"]),
    ({"prompt": PROMPT, "logit_bias": {"5": "high"}}, ["logit_bias"]),
    ({"prompt": PROMPT, "temperature": -1}, ["temperature"]),
    ({"prompt": PROMPT, "top_p": 0}, ["top_p"]),
    ({"prompt": PROMPT, "n": 0}, ["n"]),
    ({"prompt": PROMPT, "max_tokens": 0}, ["max_tokens"]),
])
def test_bad_parameters_are_400(server: ServerProcess, body: dict, words: list[str]) -> None:
    _assert_error(_post(server, {"model": server.model, **body}), 400, *words)


@pytest.mark.parametrize("content,content_type", [
    ('"a string"', "application/json"), ("[1, 2]", "application/json"),
    ("42", "application/json"), ("null", "application/json"), ("{not json", "application/json"),
    ("prompt=hi", "application/x-www-form-urlencoded")])
def test_bad_bodies_are_4xx_never_5xx(server: ServerProcess, content: str,
                                      content_type: str) -> None:
    r = httpx.post(server.base_url + "/completions", content=content,
                   headers={"content-type": content_type})                  # 32
    assert 400 <= r.status_code < 500 and r.status_code != 422
    assert "message" in r.json()["error"]


def test_client_exception_classes_and_recovery(client: openai.OpenAI,
                                               server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError):                              # 33
        client.completions.create(model=server.model, prompt=[999999])
    with pytest.raises(openai.NotFoundError):                                # 34
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert client.completions.create(model=server.model, prompt=PROMPT,
                                     max_tokens=2).usage.completion_tokens == 2


def _metric(srv: ServerProcess, name: str) -> float:
    total = 0.0
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.split()[-1])
    return total


def test_cancelled_requests_free_the_engine(server: ServerProcess) -> None:
    free_before = _metric(server, "tandem:kv_cache_free_blocks")

    async def burst() -> list[Any]:
        client = openai.AsyncOpenAI(api_key="EMPTY", base_url=server.base_url, timeout=0.5,
                                    max_retries=0)
        body = dict(model=server.model, prompt=PROMPT, max_tokens=200,
                    extra_body={"ignore_eos": True})
        results = await asyncio.gather(*(client.completions.create(**body) for _ in range(200)),
                                       return_exceptions=True)
        await client.close()
        return results

    results = asyncio.run(burst())                                             # 35
    assert all(isinstance(r, openai.APITimeoutError) for r in results), \
        {type(r).__name__ for r in results}
    start = time.monotonic()
    fresh = openai.OpenAI(api_key="EMPTY", base_url=server.base_url, timeout=5, max_retries=0)
    assert fresh.completions.create(model=server.model, prompt=PROMPT, max_tokens=3) \
        .usage.completion_tokens == 3
    assert time.monotonic() - start < 5
    deadline = time.monotonic() + 10
    while _metric(server, "tandem:kv_cache_free_blocks") != free_before:
        assert time.monotonic() < deadline, "cancelled requests kept their KV blocks"
        time.sleep(0.1)


def test_dropped_stream_frees_its_blocks(server: ServerProcess) -> None:
    free_before = _metric(server, "tandem:kv_cache_free_blocks")
    aborted_before = _metric(server, "tandem:request_aborted_total")
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.base_url + "/completions", json=body) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data:"):
            pass
        held = _metric(server, "tandem:kv_cache_free_blocks")
        assert held < free_before, "a running request should hold KV blocks"
    deadline = time.monotonic() + 10
    while _metric(server, "tandem:kv_cache_free_blocks") != free_before:
        assert time.monotonic() < deadline, "the dropped stream kept its KV blocks"
        time.sleep(0.05)
    assert _metric(server, "tandem:request_aborted_total") == aborted_before + 1
