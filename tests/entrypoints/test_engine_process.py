"""`tandem serve` with its engine core in a process of its own, over a socket: the same tokens as
the offline engine (greedy and seeded, streamed or not), a client that leaves aborts its request,
and a killed engine process means 503 and exit 1. (SIGTERM's drain, with the engine process
gone afterwards: test_reliability_defects.py.)"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from entrypoints.reliability_helpers import metric, post
from entrypoints.server_helpers import (ServerProcess, engine_pid, signal_core_mid_stream,
                                        start_server, stop_server)

PROMPTS = ["Hello, my name is", "The future of AI is", "1 2 3 4"]


def _streamed_text(url: str, body: dict) -> str:
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += "".join(c["text"] for c in chunk["choices"])
    return text


@pytest.fixture(scope="module")
def offline(tiny_model_dir: Path) -> Any:
    from tandem import LLM
    return LLM(model=str(tiny_model_dir), max_model_len=256)


@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 0.9, "top_p": 0.95, "seed": 1234}])
def test_streamed_and_whole_answers_equal_offline(server: ServerProcess, offline: Any,
                                                  sampling: dict) -> None:
    from tandem import SamplingParams
    pid = engine_pid(server)  # the engine runs in a process of its own, alive
    assert pid != server.proc.pid and Path(f"/proc/{pid}").exists()
    expected = [o.outputs[0].text for o in offline.generate(
        PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True, **sampling), use_tqdm=False)]
    for prompt, want in zip(PROMPTS, expected):
        body = {"prompt": prompt, "max_tokens": 24, "ignore_eos": True, **sampling}
        whole = post(server.url, "/v1/completions", body).json()["choices"][0]["text"]
        assert whole == want
        assert _streamed_text(server.url, body) == want


def test_a_client_that_leaves_aborts_its_request(server: ServerProcess) -> None:
    aborted = metric(server.url, "tandem:request_aborted_total")
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30, json={
            "prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # leaves mid-stream: the connection closes
    deadline = time.monotonic() + 5
    while metric(server.url, "tandem:request_aborted_total") != aborted + 1:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    assert metric(server.url, "tandem:num_requests_running") == 0


def test_a_killed_engine_process_means_503_then_exit_1(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny"], tmp_path / "log")
    try:
        error, rest, t0, _ = signal_core_mid_stream(srv, signal.SIGKILL)
        assert error["code"] == 503 and "engine" in error["message"], error
        assert rest.rstrip().endswith("data: [DONE]")
        assert srv.proc.wait(20) == 1
        assert time.monotonic() - t0 < 10
        assert "the engine core died" in srv.log()
    finally:
        stop_server(srv.proc)
