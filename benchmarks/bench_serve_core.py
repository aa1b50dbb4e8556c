"""The server at the engine's speed (issue 27): `tandem serve` against the offline engine, on one
model, in one run.

  offline `LLM`: one prompt, 128 greedy tokens (tok/s); 16 prompts of 64 tokens (tok/s); a
  20-token prompt with max_tokens=1 (one prefill, ms).
  `tandem serve` (one server per --config, started here): one streaming and one non-streaming
  request of 128 tokens, 16 concurrent streams of 64 tokens, the time to first token of a
  20-token prompt; each as a ratio to the offline figure.

Round by round, each served figure is measured right after its offline one (the offline engine
lives in this process, idle while the server is measured); the figures and the ratios are the
medians over --rounds. The client (in this process) shares the machine's cores with the server:
on a 2-core machine it takes time from the server it measures. So the streams are measured on
the lean client of sse_client.py (one asyncio loop, the bodies parsed at their ends), and again
on httpx (16 threads at 16 streams, every chunk parsed as it comes: `*_httpx`), with the cores
the client took at 16 streams.

  python benchmarks/bench_serve_core.py --config default --config OMP_WAIT_POLICY=PASSIVE
  python benchmarks/bench_serve_core.py --repo /tmp/old-tandem  # another checkout's server

A --config is `default` (what `tandem serve` sets), VAR=VALUE[,VAR=VALUE] for the server's
environment (the engine process inherits what the user set), or `tandem serve` flags
(`--config="--stream-interval 8"`). --repo serves another checkout (for
a before/after).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
from sse_client import concurrent_streams

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Write a long story about a robot who learns to paint."
# 20 tokens with SmolLM2's tokenizer whatever the first word (checked when the run starts); each
# time-to-first-token measurement takes a new first word, so no prefix-cache hit shortens it.
PROMPT20 = ("{} history of the city begins in the early days when farmers and traders came to the "
            "wide river valley")
# The client's CPU time over the wall time of each 16-stream measurement (cores it took).
CLIENT_CPU: dict[str, list[float]] = {"sixteen": [], "sixteen_httpx": []}
FIRST_WORDS = itertools.cycle(["The", "A", "One", "That", "My", "His", "Her", "Their", "Its",
                               "Our", "This", "Every", "No", "So", "And", "But", "Yet", "Then",
                               "Now", "Old"])


class Offline:
    """The offline engine's figures, one measurement per call."""

    def __init__(self, model: str, max_model_len: int) -> None:
        from tandem import LLM, SamplingParams
        self.params = SamplingParams
        self.llm = LLM(model=model, max_model_len=max_model_len)
        tokenizer = self.llm.get_tokenizer()
        self.prompt20_tokens = sorted({len(tokenizer(PROMPT20.format(w)).input_ids)
                                       for w in itertools.islice(FIRST_WORDS, 20)})
        self.one()  # warm-up
        # As the engine process does after loading: the start-up heap (torch, transformers, the
        # model) out of the collector's full passes, which otherwise land inside generate().
        gc.collect()
        gc.freeze()

    def one(self) -> float:
        greedy = self.params(temperature=0, max_tokens=128, ignore_eos=True)
        t0 = time.perf_counter()
        out = self.llm.generate([PROMPT], greedy, use_tqdm=False)
        return len(out[0].outputs[0].token_ids) / (time.perf_counter() - t0)

    def sixteen(self) -> float:
        params = self.params(temperature=0, max_tokens=64, ignore_eos=True)
        t0 = time.perf_counter()
        outs = self.llm.generate([f"{PROMPT} ({i})" for i in range(16)], params,
                                 use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)

    def prefill_ms(self) -> float:
        """One engine step over the 20-token prompt: add it, step until its first token."""
        engine = self.llm.llm_engine
        t0 = time.perf_counter()
        engine.add_request("prefill", PROMPT20.format(next(FIRST_WORDS)),
                           self.params(temperature=0, max_tokens=1))
        while not any(o.outputs and o.outputs[0].token_ids for o in engine.step()):
            pass
        took = (time.perf_counter() - t0) * 1000
        while engine.has_unfinished_requests():
            engine.step()
        return took


def channel_cost(steps: int = 2000) -> dict[str, float]:
    """CPU time of the channel per engine step, both ends (delta encoding, pickling, framing,
    unpickling, rebuilding the cumulative outputs), for 1 and 16 requests of 128 tokens with
    logprobs off: microseconds per step and per token. (The socket's two syscalls per step come
    on top: a few microseconds.)"""
    from tandem.engine.core_messages import EngineCoreOutputs, FrameBuffer, encode_frame
    from tandem.engine.output_deltas import DeltaEncoder, OutputAssembler
    from tandem.outputs import CompletionOutput, RequestOutput
    result = {}
    for batch in (1, 16):
        encoder, assembler, frames = DeltaEncoder(), OutputAssembler(), FrameBuffer()
        prompt = list(range(20))
        per_step = []
        done = 0
        while done < steps:
            ids = [f"r{done}-{i}" for i in range(batch)]
            for rid in ids:
                assembler.add(rid, prompt)
            tokens: list[int] = []
            for t in range(128):
                tokens.append(100 + t)
                outs = [RequestOutput(rid, None, prompt, None, [CompletionOutput(
                    0, " word" * len(tokens), list(tokens), None, None,
                    "length" if t == 127 else None)], t == 127) for rid in ids]
                t0 = time.perf_counter()
                frame = encode_frame(EngineCoreOutputs(outputs=[encoder.encode(o)
                                                                for o in outs]))
                for msg in frames.feed(frame):
                    for d in msg.outputs:
                        assembler.apply(d)
                per_step.append(time.perf_counter() - t0)
            done += 128
        us = statistics.median(per_step) * 1e6
        result[f"batch{batch}_us_per_step"] = us
        result[f"batch{batch}_us_per_token"] = us / batch
    return result


def _start(repo: Path, model: str, max_model_len: int, env: dict[str, str], port: int,
           log: Path, extra: Sequence[str] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tandem", "serve", model, "--port", str(port), "--host",
           "127.0.0.1", "--max-model-len", str(max_model_len), "--disable-log-stats",
           "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log", *extra]
    full_env = {**os.environ, "PYTHONPATH": str(repo), **env}
    proc = subprocess.Popen(cmd, env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            cwd=str(repo))
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM (the server drains and exits), then SIGKILL if it has not gone in `timeout`."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _stream(client: httpx.Client, url: str, prompt: str, max_tokens: int
            ) -> tuple[float, float, int]:
    """(seconds to the first text, seconds in all, completion tokens) of one streamed request."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    tokens = 0
    with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first or 0.0, time.perf_counter() - t0, tokens


def body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def served(url: str) -> dict[str, Callable[[], float]]:
    """The server's figures, one measurement per call of each function."""
    client = httpx.Client()
    _stream(client, url, PROMPT, 16)  # warm-up

    def one_stream() -> float:
        _, [(_, took, tokens)] = concurrent_streams(url, [body(PROMPT, 128)])
        return tokens / took

    def one_stream_httpx() -> float:
        _, took, tokens = _stream(client, url, PROMPT, 128)
        return tokens / took

    def one_plain() -> float:
        t0 = time.perf_counter()
        r = client.post(url + "/v1/completions", timeout=300, json={
            "prompt": PROMPT, "max_tokens": 128, "temperature": 0, "ignore_eos": True})
        return r.json()["usage"]["completion_tokens"] / (time.perf_counter() - t0)

    def sixteen() -> float:
        """16 streams on the lean client (sse_client.py: one asyncio loop, 0.03 of a core)."""
        c0 = time.process_time()
        took, streams = concurrent_streams(url, [body(f"{PROMPT} ({i})", 64) for i in range(16)])
        CLIENT_CPU["sixteen"].append((time.process_time() - c0) / took)
        return sum(tokens for _, _, tokens in streams) / took

    # one client a thread, made once as an application keeps its client: making an httpx.Client
    # (its SSL context) takes ~27 ms of CPU, which a client per measurement put on the server's
    # cores (0.44 s for 16, a third of a 16-stream measurement)
    clients = [httpx.Client() for _ in range(16)]

    def sixteen_httpx() -> float:
        """16 streams on 16 httpx threads, each chunk parsed as it comes."""
        tokens: list[int] = []

        def run(i: int) -> None:
            tokens.append(_stream(clients[i], url, f"{PROMPT} ({i})", 64)[2])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        t0, c0 = time.perf_counter(), time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - t0
        CLIENT_CPU["sixteen_httpx"].append((time.process_time() - c0) / took)
        return sum(tokens) / took

    def ttft_ms() -> float:
        _, [(first, _, _)] = concurrent_streams(url, [body(PROMPT20.format(next(FIRST_WORDS)), 2)])
        return first * 1000

    return {"one_stream_tok_s": one_stream, "one_stream_httpx_tok_s": one_stream_httpx,
            "one_plain_tok_s": one_plain,
            "sixteen_tok_s": sixteen, "sixteen_httpx_tok_s": sixteen_httpx, "ttft20_ms": ttft_ms}


def compare(off: Offline, srv: dict[str, Callable[[], float]], rounds: int) -> dict[str, Any]:
    """Round by round, each served figure right after the offline one it is divided by, so a
    drift in the machine's load falls on both; the medians of the figures and of the ratios."""
    pairs = [("one_stream_tok_s", off.one, "one_stream"),
             ("one_stream_httpx_tok_s", off.one, "one_stream_httpx"),
             ("one_plain_tok_s", off.one, "one_plain"),
             ("sixteen_tok_s", off.sixteen, "sixteen"),
             ("sixteen_httpx_tok_s", off.sixteen, "sixteen_httpx"),
             ("ttft20_ms", off.prefill_ms, "ttft")]
    rows: dict[str, list[tuple[float, float]]] = {name: [] for _, _, name in pairs}
    for _ in range(rounds):
        for key, offline_fn, name in pairs:
            base = offline_fn()
            rows[name].append((base, srv[key]()))
    result: dict[str, Any] = {}
    for key, _, name in pairs:
        base = [b for b, _ in rows[name]]
        ours = [v for _, v in rows[name]]
        result[key] = statistics.median(ours)
        result[key + "_offline"] = statistics.median(base)
        if name == "ttft":  # the time to first token less the offline prefill, in ms
            result["ttft_minus_prefill_ms"] = statistics.median(v - b for b, v in rows[name])
        else:
            result[name + "_ratio"] = statistics.median(v / b for b, v in rows[name])
        result[key + "_rounds"] = rows[name]
    for name, cores in CLIENT_CPU.items():
        result[name + "_client_cores"] = statistics.median(cores)
        cores.clear()
    return result


def _env(config: str) -> dict[str, str]:
    if config == "default" or config.startswith("--"):
        return {}
    return dict(item.split("=", 1) for item in config.split(","))


def _flags(config: str) -> list[str]:
    return config.split() if config.startswith("--") else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--config", action="append", default=None)
    p.add_argument("--repo", default=str(ROOT), help="the checkout to serve")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=8471)
    p.add_argument("--channel-only", action="store_true", help="only the channel's CPU cost")
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown")
    result: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "model": args.model,
                              "repo": args.repo, "servers": {}}
    result["channel"] = channel_cost()
    print("channel:", json.dumps(result["channel"]), flush=True)
    if args.channel_only:
        return
    off = Offline(args.model, args.max_model_len)
    result["prompt20_tokens"] = off.prompt20_tokens
    for config in args.config or ["default"]:
        log = Path(f"/tmp/bench_serve_core_{os.getpid()}.log")
        proc = _start(Path(args.repo), args.model, args.max_model_len, _env(config), args.port,
                      log, _flags(config))
        try:
            s = compare(off, served(f"http://127.0.0.1:{args.port}"), args.rounds)
        finally:
            _stop(proc)
        result["servers"][config] = s
        print(f"{config}:", json.dumps({k: round(v, 3) for k, v in s.items()
                                        if not k.endswith("_rounds")}), flush=True)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
