"""A soak (issue 45): `tandem serve` kept busy by --streams clients for --minutes, with its memory
sampled, its errors counted and its KV blocks checked at the end.

Each client loops over the shared prompts with output lengths drawn from 32-512 tokens (seeded):
most requests streamed (the lean client of sse_client.py), every fifth whole, and every seventh
streamed and dropped after its first chunks (the server aborts it: the path that could leak).
Every --every seconds the resident memory of the API process and of the engine core (from /proc)
is sampled. At the end, once idle, /metrics must show no running or waiting request and no KV
block in use. Growth is reported from the sample at --settle minutes to the last: before it, the
KV cache's pages are touched for the first time (the budget, --kv-cache, is kept small so that
every block has been used by then).

  python benchmarks/bench_serve_soak.py [--minutes 30] [--streams 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx

from tandem.bench.http_post import post_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_core import _start, _stop  # noqa: E402
from bench_slow_reader import _rss_mb  # noqa: E402
from common import ROOT, SMOLLM2, prompts, save  # noqa: E402
from sse_client import stream_completion  # noqa: E402


async def _dropped(url: str, body: dict) -> None:
    """A streamed request whose client reads its first lines and hangs up."""
    r = await post_json(url + "/v1/completions", {**body, "stream": True})
    try:
        n = 0
        async for _ in r.lines():
            n += 1
            if n == 3:
                break
    finally:
        r.close()


class _Tally:
    def __init__(self) -> None:
        self.requests = self.tokens = self.dropped = 0
        self.errors: list[str] = []


async def _client(i: int, url: str, model: str, texts: list[str], stop_at: float,
                  tally: _Tally) -> None:
    rng = random.Random(i)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        body = {"model": model, "prompt": texts[(i + 16 * n) % len(texts)],
                "max_tokens": rng.randint(32, 512), "temperature": 0.8, "seed": n,
                "ignore_eos": True}
        try:
            if n % 7 == 0:
                await _dropped(url, body)
                tally.dropped += 1
                continue
            if n % 5 == 0:
                r = await post_json(url + "/v1/completions", body)
                try:
                    answer = await r.read()
                finally:
                    r.close()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {answer[:200]!r}")
                tokens = json.loads(answer)["usage"]["completion_tokens"]
            else:
                _, _, tokens = await stream_completion(host, int(port), body)
            if tokens != body["max_tokens"]:
                raise RuntimeError(f"{tokens} tokens, asked for {body['max_tokens']}")
            tally.requests += 1
            tally.tokens += tokens
        except Exception as e:  # noqa: BLE001 - counted and shown, the soak goes on
            tally.errors.append(f"{type(e).__name__}: {e}")


async def _soak(url: str, model: str, streams: int, seconds: float, every: float, pid: int,
                tally: _Tally) -> list[dict]:
    texts = prompts(64)
    t0 = time.monotonic()
    clients = [asyncio.create_task(_client(i, url, model, texts, t0 + seconds, tally))
               for i in range(streams)]
    curve = []
    while not all(c.done() for c in clients):
        api, core = _rss_mb(pid)
        curve.append({"minute": (time.monotonic() - t0) / 60, "api_mb": api, "core_mb": core,
                      "requests": tally.requests, "errors": len(tally.errors)})
        print(f"{curve[-1]['minute']:6.1f} min: API {api:7.1f} MB, engine core {core:7.1f} MB, "
              f"{tally.requests} requests, {len(tally.errors)} errors", flush=True)
        await asyncio.wait(clients, timeout=every)
    return curve


def _idle_metrics(url: str) -> dict[str, float]:
    """The engine's gauges once nothing runs (waits up to 30 s for the last aborts)."""
    want = ("tandem:num_requests_running", "tandem:num_requests_waiting",
            "tandem:kv_cache_usage_perc")
    deadline = time.monotonic() + 30
    while True:
        found = {}
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in want:
                found[name] = float(line.rsplit(" ", 1)[1])
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--every", type=float, default=60.0, help="seconds between memory samples")
    p.add_argument("--settle", type=float, default=2.0, help="minutes before growth is counted")
    p.add_argument("--kv-cache", default="512MiB",
                   help="the KV budget: small, so that every block is used (its pages touched) "
                        "before --settle, and what grows after is the server's own")
    p.add_argument("--port", type=int, default=8313)
    p.add_argument("--repo", default=str(ROOT))
    args = p.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    proc = _start(Path(args.repo), args.model, 1024, {}, args.port, Path("/tmp/bench_soak.log"),
                  ["--kv-cache-memory-bytes", args.kv_cache])
    tally = _Tally()
    t0 = time.monotonic()
    try:
        curve = asyncio.run(_soak(url, args.model, args.streams, args.minutes * 60, args.every,
                                  proc.pid, tally))
        took = time.monotonic() - t0
        gauges = _idle_metrics(url)
        api, core = _rss_mb(proc.pid)
        curve.append({"minute": took / 60, "api_mb": api, "core_mb": core,
                      "requests": tally.requests, "errors": len(tally.errors)})
    finally:
        _stop(proc)
    settled = next((s for s in curve if s["minute"] >= args.settle), curve[0])
    total = [s["api_mb"] + s["core_mb"] for s in (settled, curve[-1])]
    result = {"model": args.model, "streams": args.streams, "minutes": took / 60,
              "requests": tally.requests, "dropped": tally.dropped,
              "output_tokens_per_s": tally.tokens / took, "errors": len(tally.errors),
              "first_errors": tally.errors[:5], "idle_gauges": gauges,
              "growth_from_settled": total[1] / total[0] - 1,
              "api_growth_from_settled": curve[-1]["api_mb"] / settled["api_mb"] - 1,
              "curve": curve}
    print(f"{tally.requests} requests ({tally.dropped} dropped by their clients), "
          f"{result['output_tokens_per_s']:.0f} output tok/s, {len(tally.errors)} errors; "
          f"memory {total[0]:.1f} -> {total[1]:.1f} MB from minute {settled['minute']:.1f} "
          f"({100 * result['growth_from_settled']:+.1f}%; API "
          f"{100 * result['api_growth_from_settled']:+.1f}%); idle: {gauges}")
    print(save("serve-soak", result))


if __name__ == "__main__":
    main()
