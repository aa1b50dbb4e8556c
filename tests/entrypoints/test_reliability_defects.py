"""Regression tests, over real sockets, for each way a careless or hostile client could once break
`tandem serve` (the reliability issue's eight defects), plus graceful shutdown and engine death."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from entrypoints.reliability_helpers import (REL_BLOCKS, RELIABILITY, LatencyProbe, metric,
                                             post, wait_idle)
from entrypoints.server_helpers import (API_KEY, REPO_ROOT, ServerProcess, engine_pid,
                                        free_port, start_server, stop_server)

BODY = {"prompt": "The future of AI is", "max_tokens": 8, "temperature": 0}


def _stream_in_background(url: str, body: dict, results: list, key: Any = None) -> threading.Thread:
    def run() -> None:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                          timeout=120) as r:
            text = "".join(r.iter_text())
        results.append((key, r.status_code, text))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ---- 1. a client that gives up during admission ------------------------------------------------

def test_client_timeout_during_admission_leaves_the_engine_running(fake_server: Any) -> None:
    """While a step runs, a request's admission waits; a client that times out then cancels it.
    The engine thread once called set_result on the cancelled future and died."""
    fake_server.fake.step_delay = 0.2
    results: list = []
    try:
        stream = _stream_in_background(fake_server.url, {"prompt": "Hello", "max_tokens": 15,
                                                         "ignore_eos": True}, results)
        time.sleep(0.3)
        for _ in range(3):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(fake_server.url + "/v1/completions", timeout=0.02,
                           json={"prompt": "hi", "max_tokens": 8})
        stream.join(30)
    finally:
        fake_server.fake.step_delay = 0.0
    assert results and results[0][1] == 200 and "[DONE]" in results[0][2]
    assert httpx.get(fake_server.url + "/health").status_code == 200
    r = post(fake_server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while fake_server.engine.num_in_flight or fake_server.fake.requests:
        assert time.monotonic() < deadline, "cancelled admissions left requests behind"
        time.sleep(0.05)


def test_client_timeouts_against_the_real_engine(rel_server: ServerProcess) -> None:
    results: list = []
    stream = _stream_in_background(rel_server.url, {"prompt": "Hello", "max_tokens": 60,
                                                    "ignore_eos": True}, results)
    timeouts = 0
    for _ in range(20):
        try:
            httpx.post(rel_server.url + "/v1/completions", timeout=0.02,  # 64 steps take longer
                       json={"prompt": "hi", "max_tokens": 64, "ignore_eos": True})
        except httpx.TimeoutException:
            timeouts += 1
    assert timeouts >= 1  # a client gave up mid-request: what this test is about
    stream.join(60)
    assert results[0][1] == 200 and "[DONE]" in results[0][2]
    assert httpx.get(rel_server.url + "/health").status_code == 200
    assert post(rel_server.url, "/v1/completions", BODY).status_code == 200
    wait_idle(rel_server.url, REL_BLOCKS)


# ---- 2. one bad parameter ------------------------------------------------------------------------

HUGE = 9223372036854775808  # 2**63: one past int64


@pytest.mark.parametrize("field,value", [("top_k", HUGE), ("max_tokens", HUGE), ("seed", HUGE),
                                         ("n", HUGE), ("logprobs", HUGE), ("min_tokens", HUGE),
                                         ("stop_token_ids", [HUGE]), ("top_k", -5),
                                         ("temperature", 1e308), ("prompt_logprobs", HUGE)])
def test_an_out_of_range_field_fails_only_its_request(rel_server: ServerProcess, field: str,
                                                      value: Any) -> None:
    results: list = []
    streams = [_stream_in_background(rel_server.url, {"prompt": f"Story {i}:", "max_tokens": 24,
                                                      "ignore_eos": True, "temperature": 0},
                                     results, key=i) for i in range(4)]
    time.sleep(0.2)
    r = post(rel_server.url, "/v1/completions", {**BODY, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400
    for t in streams:
        t.join(60)
    assert sorted(k for k, status, text in results if status == 200 and "[DONE]" in text
                  and '"error"' not in text) == [0, 1, 2, 3]


# ---- 3. client-chosen request ids -----------------------------------------------------------------

def test_client_request_ids_cannot_collide_with_internal_ids(rel_server: ServerProcess) -> None:
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "n": 2,
            "temperature": 0, "request_id": "a"}
    comp = {**BODY, "max_tokens": 12, "request_id": "0_a"}
    alone_chat = post(rel_server.url, "/v1/chat/completions", chat).json()
    alone_comp = post(rel_server.url, "/v1/completions", comp).json()
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda k=k, p=p, b=b: out.__setitem__(
        k, post(rel_server.url, p, b).json())) for k, p, b in
        (("chat", "/v1/chat/completions", chat), ("comp", "/v1/completions", comp))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [c["message"]["content"] for c in out["chat"]["choices"]] == \
        [c["message"]["content"] for c in alone_chat["choices"]]
    assert out["comp"]["choices"][0]["text"] == alone_comp["choices"][0]["text"]
    assert out["chat"]["id"] == "a" and out["comp"]["id"] == "0_a"  # the response keeps them
    wait_idle(rel_server.url, REL_BLOCKS)


# ---- 4. lone surrogates ------------------------------------------------------------------------------

SURROGATE_BODIES = [
    ("/v1/completions", '{"prompt": "ab\\ud800cd", "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": ["ok", "ab\\udfffcd"], "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": "ok", "model": "\\ud800"}'),
    ("/v1/completions", '{"prompt": "ok", "request_id": "\\ud800", "stream": true}'),
    ("/v1/completions", '{"prompt": "ok", "stop": ["\\ud800"]}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x\\ud800"}]}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'),
    ("/tokenize", '{"prompt": "ab\\ud800cd"}'),
    ("/v1/completions", '{"prompt": "ok", "\\ud800": 1}'),
]


@pytest.mark.parametrize("path,raw", SURROGATE_BODIES)
def test_lone_surrogates_are_a_400_naming_the_field(server: ServerProcess, path: str,
                                                    raw: str) -> None:
    r = httpx.post(server.url + path, content=raw.encode(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200
    assert post(server.url, "/v1/completions", BODY).status_code == 200


# ---- 5. n without bound -----------------------------------------------------------------------------

def test_n_is_capped(server: ServerProcess) -> None:
    r = post(server.url, "/v1/completions", {**BODY, "n": 1_000_000_000})
    assert r.status_code == 400 and "n must be at most 16384" in r.json()["error"]["message"]


def test_a_large_fan_out_does_not_starve_the_next_request(rel_server: ServerProcess) -> None:
    """n = 3000 is admitted a window at a time: a request arriving after it is served within
    seconds; when its client leaves, every one of its sequences is aborted. (384k tokens: more
    than the engine makes before the client's 4 s are up, even with the final-only path.)"""
    big: list = []

    def run_big() -> None:
        try:
            big.append(httpx.post(rel_server.url + "/v1/completions", timeout=4,
                                  json={"prompt": "Hello", "max_tokens": 128, "n": 3000,
                                        "ignore_eos": True}).status_code)
        except httpx.TimeoutException:
            big.append("left")

    thread = threading.Thread(target=run_big, daemon=True)
    thread.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    assert post(rel_server.url, "/v1/completions", BODY, timeout=30).status_code == 200
    waited = time.perf_counter() - t0
    thread.join(30)
    assert big == ["left"]
    RELIABILITY["request behind an n=3000 fan-out"] = f"served in {waited:.2f} s"
    assert waited < 3.0
    wait_idle(rel_server.url, REL_BLOCKS)


# ---- 6. heavy work off the event loop --------------------------------------------------------------

def test_a_huge_prompt_does_not_stall_health(server: ServerProcess) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 70_000  # ~3 MB
    with LatencyProbe(server.url, "/health") as probe:
        r = post(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 2}, timeout=120)
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    RELIABILITY["/health worst latency during a 3 MB prompt"] = f"{probe.worst * 1000:.0f} ms"
    assert probe.worst < 0.5, probe.worst


NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"


def test_request_chat_templates_need_the_opt_in(server: ServerProcess) -> None:
    r = post(server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "chat_template": NESTED})
    assert r.status_code == 400 and "--trust-request-chat-template" in r.json()["error"]["message"]
    r = post(server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"chat_template": NESTED}})
    assert r.status_code == 400


def test_a_looping_request_template_is_stopped_and_others_keep_streaming(
        secured_base_server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with LatencyProbe(secured_base_server.url, "/health") as probe:
        t0 = time.perf_counter()
        r = httpx.post(secured_base_server.base_url + "/chat/completions", headers=headers,
                       timeout=60, json={"messages": [{"role": "user", "content": "hi"}],
                                         "chat_template": NESTED, "max_tokens": 2})
        took = time.perf_counter() - t0
    assert r.status_code == 400 and "ran for more than" in r.json()["error"]["message"]
    assert took < 10 and probe.worst < 0.5, (took, probe.worst)


def _worst_latencies_while_16_streams_run(url: str) -> tuple[float, float, str]:
    """The slowest /metrics and /health answers, polled from before the 16 requests arrive until
    the last stream ends (so the burst of admissions is inside the window), and a summary."""
    results: list = []
    with LatencyProbe(url, "/metrics") as metrics_probe, \
            LatencyProbe(url, "/health") as health_probe:
        streams = [_stream_in_background(url, {"prompt": f"Tale {i}", "max_tokens": 48,
                                               "ignore_eos": True, "temperature": 0.8},
                                         results, key=i) for i in range(16)]
        for t in streams:
            t.join(120)
    assert len(results) == 16 and all(status == 200 for _, status, _ in results)
    assert len(metrics_probe.latencies) >= 10 and len(health_probe.latencies) >= 10
    return metrics_probe.worst, health_probe.worst, (
        f"/metrics {metrics_probe.worst * 1000:.0f} ms ({len(metrics_probe.latencies)} polls), "
        f"/health {health_probe.worst * 1000:.0f} ms ({len(health_probe.latencies)} polls)")


def test_metrics_and_health_answer_fast_while_16_streams_run(rel_server: ServerProcess) -> None:
    """Under 100 ms, the reliability issue's bound. Here the test's own client (16 streaming
    threads and two probe processes) shares the 2 cores with the server, and about one run in 10
    to 20 puts a single poll over 100 ms (docs/performance.md), so a run over it is repeated, up
    to three times, and no run may reach half a second. A server that is slow for a reason of its
    own fails all three: the /metrics of the reliability issue, which waited for the engine, took
    seconds. (Nagle's 40 ms on every answer is test_serve_latency's.)"""
    runs = []
    for _ in range(3):
        runs.append(_worst_latencies_while_16_streams_run(rel_server.url))
        if max(runs[-1][:2]) < 0.1:
            break
    RELIABILITY["worst latency while 16 streams run"] = "; then ".join(r[2] for r in runs)
    assert all(max(r[:2]) < 0.5 for r in runs), runs
    assert max(runs[-1][:2]) < 0.1, runs


# ---- 7. seeded sampling under preemption -----------------------------------------------------------

def test_seeded_requests_are_identical_under_load_and_forced_preemption(
        rel_server: ServerProcess) -> None:
    """Twelve requests (seeded sampling and greedy) alone, then all at once on a KV cache that
    cannot hold them: the same tokens, with the draft model on."""
    bodies = [{"prompt": f"Once upon a time {i}", "max_tokens": 64, "ignore_eos": True,
               **({"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i} if i % 3 else
                  {"temperature": 0})} for i in range(12)]
    alone = [post(rel_server.url, "/v1/completions", b).json()["choices"][0]["text"]
             for b in bodies]
    before = metric(rel_server.url, "tandem:num_preemptions_total")
    out: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i, b=b: out.__setitem__(
        i, post(rel_server.url, "/v1/completions", b, timeout=120).json()["choices"][0]["text"]))
        for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    preemptions = metric(rel_server.url, "tandem:num_preemptions_total") - before
    mismatches = sum(out[i] != alone[i] for i in range(12))
    RELIABILITY["load under forced preemption (draft on)"] = (
        f"12 requests (8 seeded, 4 greedy), {mismatches} mismatches, {preemptions:.0f} "
        "preemptions")
    assert preemptions > 0, "the KV budget should force preemption"
    assert mismatches == 0
    wait_idle(rel_server.url, REL_BLOCKS)


# ---- 8. the KV budget from the command line ---------------------------------------------------------

def test_kv_cache_memory_bytes_flag_sets_the_budget(rel_server: ServerProcess) -> None:
    assert metric(rel_server.url, "tandem:kv_cache_free_blocks") == REL_BLOCKS
    assert "KV cache: 24 blocks" in rel_server.log()


# ---- graceful shutdown and engine death -------------------------------------------------------------

def test_sigterm_stops_admitting_finishes_in_flight_and_exits_zero(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny",
                                             "--shutdown-timeout", "5"], tmp_path / "log")
    results: list = []
    stream = _stream_in_background(srv.url, {"prompt": "Hello", "max_tokens": 200,
                                             "ignore_eos": True}, results)
    time.sleep(0.5)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        refused = httpx.post(srv.url + "/v1/completions", json=BODY, timeout=5).status_code
    except httpx.HTTPError:
        refused = "connection refused"
    assert refused in (503, "connection refused")
    code = srv.proc.wait(30)
    stream.join(30)
    assert code == 0 and time.monotonic() - t0 < 20
    assert results and results[0][1] == 200 and "[DONE]" in results[0][2]  # it was let finish
    assert not Path(f"/proc/{engine_pid(srv)}").exists()  # the engine process stopped with it
    stop_server(srv.proc)


DYING_SERVER = """
import sys, time
sys.path.insert(0, {tests!r})
from transformers import AutoTokenizer
from entrypoints.fake_engine import FakeEngine
from tandem.engine.async_engine import AsyncLLMEngine
from tandem.entrypoints.openai.api_server import run_server
from tandem.entrypoints.openai.args import parse_serve_args

fake = FakeEngine(AutoTokenizer.from_pretrained({model!r}))
def step():
    raise SystemExit("the loop dies")  # not an Exception: escapes the step guard
fake.step = step
args = parse_serve_args(["fake", "--host", "127.0.0.1", "--port", "{port}"])
run_server(args, AsyncLLMEngine(fake), None, time.perf_counter())
"""


def test_a_dead_engine_loop_makes_the_server_exit_nonzero(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    port = free_port()
    script = DYING_SERVER.format(tests=str(REPO_ROOT / "tests"), model=str(tiny_model_dir),
                                 port=port)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=str(REPO_ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        try:
            httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       timeout=10)
        except httpx.HTTPError:
            pass
        assert proc.wait(20) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
    assert b"the engine loop died" in proc.stdout.read()
