"""The `spec_decode_token_origin` extension: each generated token marked "draft" (an accepted
draft) or "target", over a real socket, streamed and not, completions and chat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from entrypoints.server_helpers import ServerProcess, start_server, stop_server
from tiny_models import build_tiny_model

K = 3


@pytest.fixture(scope="module")
def random_draft_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[ServerProcess]:
    """The same tokenizer, a draft with independent random weights."""
    draft = build_tiny_model(tmp_path_factory.mktemp("random-draft"), arch="llama", seed=123)
    spec = json.dumps({"model": str(draft), "num_speculative_tokens": K, "adaptive": False})
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny-rand",
                                             "--speculative-config", spec],
                       tmp_path_factory.mktemp("logs") / "random_draft.log")
    yield srv
    stop_server(srv.proc)


def complete(srv: ServerProcess, **body: Any) -> dict[str, Any]:
    body = {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
            "spec_decode_token_origin": True, **body}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream_choices(srv: ServerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", srv.url + path, json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += json.loads(line[6:])["choices"]
    return chunks


def joined(choices: list[dict[str, Any]], key: str) -> list[Any]:
    return [x for c in choices for x in c.get(key, [])]


def runs(origins: list[str]) -> list[int]:
    """Lengths of the draft runs before each target token (accepted drafts per step)."""
    out, n = [], 0
    for o in origins:
        if o == "draft":
            n += 1
        else:
            out.append(n)
            n = 0
    return out


def test_self_draft_greedy_marks_all_but_bonus_tokens_as_draft(spec_server: ServerProcess
                                                                ) -> None:
    body = complete(spec_server, temperature=0)
    choice = body["choices"][0]
    origins = choice["spec_decode_token_origin"]
    assert len(origins) == len(choice["spec_decode_token_ids"]) == 40
    assert set(origins) <= {"draft", "target"}
    # The prefill's token, then every verify step accepts all K drafts and adds the bonus.
    assert origins[0] == "target" and all(n == K for n in runs(origins[1:])[:-1])
    assert choice["spec_decode_rejected_draft"] == [None] * 40
    stats = body["metrics"]["speculative_decoding"]
    assert origins.count("draft") == stats["num_accepted_draft_tokens"]
    assert origins.count("target") - 1 in (stats["num_spec_steps"], stats["num_spec_steps"] + 1)


def test_random_draft_marks_almost_none(random_draft_server: ServerProcess) -> None:
    body = complete(random_draft_server, temperature=0, max_tokens=60)
    choice = body["choices"][0]
    origins = choice["spec_decode_token_origin"]
    stats = body["metrics"]["speculative_decoding"]
    assert origins.count("draft") == stats["num_accepted_draft_tokens"]
    assert origins.count("draft") / len(origins) < 0.2, origins
    rejected = [r for r in choice["spec_decode_rejected_draft"] if r is not None]
    # a rejected guess for (almost) every target token after the first
    assert len(rejected) >= stats["num_spec_steps"] - stats["acceptance_histogram"][-1]
    assert all(isinstance(r, str) for r in rejected)


def test_sampled_marks_match_spec_stats_and_stream_equals_non_stream(
        spec_server: ServerProcess) -> None:
    params = {"temperature": 1.0, "seed": 7, "max_tokens": 30}
    full = complete(spec_server, **params)
    origins = full["choices"][0]["spec_decode_token_origin"]
    assert origins.count("draft") == \
        full["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
    chunks = stream_choices(spec_server, "/v1/completions",
                            {"prompt": "Once upon a time", "ignore_eos": True,
                             "spec_decode_token_origin": True, **params})
    assert joined(chunks, "spec_decode_token_origin") == origins
    assert joined(chunks, "spec_decode_token_ids") == \
        full["choices"][0]["spec_decode_token_ids"]
    for c in chunks:  # each chunk's lists are that chunk's tokens
        assert len(c["spec_decode_token_origin"]) == len(c["spec_decode_token_ids"]) == \
            len(c["spec_decode_rejected_draft"])


def test_chat_streamed_and_not(spec_server: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "spec_decode_token_origin": True}
    r = httpx.post(spec_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    choice = r["choices"][0]
    assert len(choice["spec_decode_token_origin"]) == 24
    assert choice["spec_decode_token_origin"].count("draft") == \
        r["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
    chunks = stream_choices(spec_server, "/v1/chat/completions", body)
    assert joined(chunks, "spec_decode_token_origin") == choice["spec_decode_token_origin"]


def test_off_by_default_and_all_target_without_a_draft(server: ServerProcess) -> None:
    plain = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"prompt": "a", "max_tokens": 5}).json()["choices"][0]
    assert not any(k.startswith("spec_decode") for k in plain)
    marked = complete(server, max_tokens=8)["choices"][0]
    assert marked["spec_decode_token_origin"] == ["target"] * 8
    assert marked["spec_decode_rejected_draft"] == [None] * 8


def test_a_request_turns_speculation_off_or_caps_it(spec_server: ServerProcess) -> None:
    """`disable_spec_decode` and `num_speculative_tokens` in the body (the openai client's
    extra_body) act on that request alone; bad values are a 400 naming the field."""
    off = complete(spec_server, temperature=0, disable_spec_decode=True)["choices"][0]
    assert off["spec_decode_token_origin"] == ["target"] * 40
    capped = complete(spec_server, temperature=0, num_speculative_tokens=1)["choices"][0]
    assert max(runs(capped["spec_decode_token_origin"])) == 1  # self-draft: all 1 accepted
    assert capped["spec_decode_token_ids"] == off["spec_decode_token_ids"]
    r = httpx.post(spec_server.url + "/v1/completions", timeout=60,
                   json={"prompt": "a", "max_tokens": 4, "num_speculative_tokens": -2})
    assert r.status_code == 400 and "num_speculative_tokens" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def ngram_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[ServerProcess]:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
                       "prompt_lookup_max": 3, "adaptive": False})
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny-ngram",
                                             "--speculative-config", spec],
                       tmp_path_factory.mktemp("logs") / "ngram.log")
    yield srv
    stop_server(srv.proc)


def test_an_ngram_server_marks_the_tokens_its_lookups_gave(ngram_server: ServerProcess,
                                                          server: ServerProcess) -> None:
    prompt = "one two three four one two three four one two three four one two"
    body = complete(ngram_server, prompt=prompt, temperature=0, max_tokens=48)
    choice = body["choices"][0]
    plain = complete(server, prompt=prompt, temperature=0, max_tokens=48)["choices"][0]
    assert choice["text"] == plain["text"]  # greedy: the plain tokens
    origins = choice["spec_decode_token_origin"]
    stats = body["metrics"]["speculative_decoding"]
    # The lookup's accepted drafts carry its name (the page colours them apart).
    assert "draft" not in origins
    assert origins.count("ngram") == stats["num_accepted_draft_tokens"] > 0
    metrics = httpx.get(ngram_server.url + "/metrics", timeout=30).text
    assert 'vllm:spec_decode_num_drafts_total' in metrics
