"""Tensor parallelism on real torch.distributed processes (gloo on loopback): tp=2 gives the same
tokens as tp=1 (greedy and seeded, with and without a draft, same-vocabulary and TLI), through
`LLM` and through `tandem serve`, across two "nodes"; a dead worker is reported within seconds;
no process is left behind."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from entrypoints.server_helpers import (REPO_ROOT, free_port, serve_command, start_server,
                                        stop_server)
from tandem import LLM, SamplingParams
from tandem.distributed.errors import WorkerDiedError

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = [SamplingParams(temperature=0.9, top_p=0.95, seed=40 + i, max_tokens=24,
                         ignore_eos=True) for i in range(4)]


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def reference(tiny_llama, prompts) -> dict[str, list[list[int]]]:
    llm = LLM(tiny_llama)
    greedy = llm.generate(prompts, GREEDY, use_tqdm=False)
    return {"greedy": tokens(greedy), "text0": greedy[0].outputs[0].text,
            "seeded": tokens(llm.generate(prompts[:4], SEEDED, use_tqdm=False))}


def test_sizes_that_do_not_fit_are_refused_with_the_allowed_ones(tiny_llama):
    # The tiny llama: 4 attention heads, 2 KV heads, intermediate size 128.
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not fit .*Allowed sizes: "
                                         r"\[1, 2, 4\]"):
        LLM(tiny_llama, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="draft_tensor_parallel_size=3 cannot be other value"):
        LLM(tiny_llama, tensor_parallel_size=2, speculative_config={
            "model": tiny_llama, "num_speculative_tokens": 2, "draft_tensor_parallel_size": 3})


def test_tp2_equals_tp1_and_leaves_no_process(tiny_llama, prompts, reference):
    """Greedy and seeded sampling, under forced preemption (a KV budget of 20 blocks)."""
    llm = LLM(tiny_llama, tensor_parallel_size=2, kv_cache_memory_bytes=20 * 1024,
              max_model_len=128)
    workers = children(os.getpid())
    assert workers, "tp=2 should run a worker process"
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference["greedy"]
    assert tokens(llm.generate(prompts[:4], SEEDED, use_tqdm=False)) == reference["seeded"]
    assert llm.llm_engine.scheduler.num_preemptions > 0
    del llm  # no explicit shutdown: the end of the LLM object stops its workers
    gc.collect()
    deadline = time.monotonic() + 10
    while [p for p in workers if p in children(os.getpid())]:
        assert time.monotonic() < deadline, "worker processes outlived the LLM object"
        time.sleep(0.1)


@pytest.mark.parametrize("draft,draft_tp", [("same", 2), ("tli", 1)])
def test_tp2_with_a_draft_equals_tp1(tiny_llama, tli_draft, prompts, reference, draft, draft_tp):
    spec = {"model": tiny_llama if draft == "same" else tli_draft,
            "num_speculative_tokens": 3, "adaptive": False,
            "draft_sample_method": "probabilistic", "use_heterogeneous_vocab": draft == "tli"}
    alone = LLM(tiny_llama, speculative_config=spec)  # tp=1 with the same draft
    seeded = tokens(alone.generate(prompts[:4], SEEDED, use_tqdm=False))
    del alone
    llm = LLM(tiny_llama, tensor_parallel_size=2,
              speculative_config={**spec, "draft_tensor_parallel_size": draft_tp})
    try:
        assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference["greedy"]
        assert tokens(llm.generate(prompts[:4], SEEDED, use_tqdm=False)) == seeded
        m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
        assert m["tandem:spec_decode_num_accepted_tokens"] > 0
    finally:
        llm.llm_engine.shutdown()


def test_a_killed_worker_is_reported_within_seconds(tiny_llama, prompts):
    llm = LLM(tiny_llama, tensor_parallel_size=2)
    try:
        llm.generate(prompts[:1], GREEDY, use_tqdm=False)
        (worker,) = children(os.getpid())
        os.kill(worker, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match="rank 1"):
            while time.monotonic() - t0 < 15:
                llm.generate(prompts[:1], GREEDY, use_tqdm=False)
        assert time.monotonic() - t0 < 10
    finally:
        llm.llm_engine.shutdown()


def _completion(url: str, prompt: str) -> str:
    r = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_serve_tp2_matches_tp1_and_a_dead_worker_stops_the_server(tiny_llama, reference,
                                                                   prompts, tmp_path):
    srv = start_server(tiny_llama, ["--served-model-name", "tiny", "-tp", "2"], tmp_path / "log")
    try:
        assert _completion(srv.url, prompts[0]) == reference["text0"]
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": prompts[0], "max_tokens": 24, "temperature": 0,
                "ignore_eos": True, "stream": True}) as r:
            events = [json.loads(line[5:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == reference["text0"]
        assert "tandem:generation_tokens_total" in httpx.get(srv.url + "/metrics").text
        (engine,) = children(srv.proc.pid)  # the engine core process starts the workers
        workers = children(engine)
        assert workers
        os.kill(workers[-1], signal.SIGKILL)
        t0 = time.monotonic()
        code = srv.proc.wait(20)
        assert code == 1 and time.monotonic() - t0 < 10
        assert "engine loop died" in srv.log() and "rank 1" in srv.log()
        assert not [p for p in [engine, *workers] if _alive(p)]
    finally:
        stop_server(srv.proc)


def test_ctrl_c_stops_the_server_and_its_workers(tiny_llama, tmp_path):
    srv = start_server(tiny_llama, ["--served-model-name", "tiny", "-tp", "2"], tmp_path / "log")
    (engine,) = children(srv.proc.pid)  # the engine core process starts the workers
    workers = children(engine)
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(30) == 0
    assert workers and not [p for p in [engine, *workers] if _alive(p)]


def test_two_nodes_on_loopback_match_tp1(tiny_llama, reference, prompts, tmp_path):
    """Node 1 runs rank 1 only, as its own process tree, configured through the environment
    (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK); node 0 runs the engine, rank 0 and the API,
    configured by flags. They meet through the rendezvous at 127.0.0.1:PORT."""
    port = str(free_port())
    common = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NNODES": "2",
           "NODE_RANK": "1"}
    with open(tmp_path / "node1.log", "w") as log:
        node1 = subprocess.Popen(serve_command(tiny_llama, "--max-model-len", "256", "-tp", "2"),
                                 stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                 env=env, start_new_session=True)
    try:
        srv = start_server(tiny_llama, ["--served-model-name", "tiny", "--node-rank", "0",
                                        *common], tmp_path / "node0.log")
        try:
            assert _completion(srv.url, prompts[0]) == reference["text0"]
        finally:
            stop_server(srv.proc)
        assert node1.wait(30) == 0, (tmp_path / "node1.log").read_text()
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait(5)
