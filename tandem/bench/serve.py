"""`tandem bench serve`: a running OpenAI-compatible server at several concurrency levels.

Streams completions (ignore_eos, so each asks for exactly --max-tokens) with C requests in
flight at a time; per level: time to first token, inter-token latency (gaps between streamed
chunks), output tokens/s and requests/s. Works against tandem or any vLLM-compatible server.
`--no-stream` asks for whole answers (the time to first token is then the whole request's).
With `--server-pid` (a server on this machine), the CPU time its process and its children (the
engine core) spent per output token at each level: what the API side costs, apart from the
engine.
With --peer-url, the same client runs against a second server (llama-server, vLLM) at each level
in turn, and the ratios ours/peer are printed. The client is lean (`http_post.py`: raw HTTP/1.1 on
asyncio streams; 159-193 us of CPU per streamed token at one stream where httpx took 520, Intel
Xeon 6/167), since it shares the machine with the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from typing import Any, Optional

from tandem.bench.common import add_prompt_args, load_prompts, pyplot, summary, write_json
from tandem.bench.http_post import NoResponse, post_json


async def _one(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    for attempt in range(_ATTEMPTS):
        try:
            result = await _timed(url, body, headers)
            result["retries"] = attempt
            return result
        except NoResponse as e:
            # A server that closes a connection as the request goes out on it answered nothing
            # (llama-server did, on kept-alive connections): send it again, counted.
            if attempt + 1 == _ATTEMPTS:
                raise RuntimeError(f"{url}: no response in {_ATTEMPTS} attempts: {e}") from e
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:  # say which server
            raise RuntimeError(f"{url}: {type(e).__name__}: {e}") from e
    raise AssertionError("unreachable")


_ATTEMPTS = 3
# A completion chunk with text in it (a token's), found without parsing the JSON: inside a
# string a quote is escaped, so this can only be the key and the start of a non-empty value.
TEXT_CHUNK = re.compile(rb'"text": ?"[^"]')


async def _timed(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = await asyncio.wait_for(post_json(url, body, headers), 600)
    try:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {(await r.read())[:300]!r}")
        if not body["stream"]:
            tokens = (json.loads(await r.read()).get("usage") or {}).get("completion_tokens", 0)
            return {"ttft": time.perf_counter() - t0, "gaps": [], "tokens": tokens,
                    "usage": bool(tokens)}
        stamps: list[float] = []
        tokens = 0
        async for line in r.lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            # Only a chunk that may carry usage or an error is parsed: JSON-decoding every
            # token's chunk cost this client (on the server's cores) about a fifth of its time.
            # Inside a string a quote is escaped, so `"usage"` is a key.
            if b'"usage"' not in line and b'"error"' not in line:
                if TEXT_CHUNK.search(line):
                    stamps.append(time.perf_counter())
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())
    finally:
        r.close()
    end = time.perf_counter()
    # A server that sends no usage (some peers ignore stream_options) is counted by its chunks,
    # one token each, as llama-server streams them.
    return {"ttft": (stamps[0] - t0) if stamps else end - t0,
            "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "tokens": tokens or len(stamps),
            "usage": bool(tokens)}


def descendants(pid: int) -> list[int]:
    """The live descendants of process `pid` (Linux /proc), children before grandchildren."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    found = [int(c) for c in f.read().split()]
                    out += found
                    todo += found
        except FileNotFoundError:
            continue  # it exited meanwhile
    return out


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process `pid`, and of its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(p: int) -> float:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return own(pid), sum(own(c) for c in descendants(pid))


async def _level(base_url: str, model: str, prompts: list[str], concurrency: int,
                 args: argparse.Namespace, api_key: Optional[str], bar: Any,
                 server_pid_applies: bool = True) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens,
                    "temperature": args.temperature, "ignore_eos": True, "stream": args.stream}
            if args.stream:
                body["stream_options"] = {"include_usage": True}
            results.append(await _one(base_url + "/completions", body, headers))
            bar.update(1)

    pid = getattr(args, "server_pid", None) if server_pid_applies else None
    cpu0 = _cpu_seconds(pid) if pid else None
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    cpu = {}
    if cpu0 is not None:
        api, core = (b - a for a, b in zip(cpu0, _cpu_seconds(pid)))
        cpu = {"api_cpu_us_per_token": 1e6 * api / max(tokens, 1),
               "engine_cpu_us_per_token": 1e6 * core / max(tokens, 1)}
    return {"concurrency": concurrency, **cpu, "requests": len(results), "seconds": seconds,
            "tokens_counted_by": "usage" if all(r["usage"] for r in results) else "chunks",
            "retries": sum(r["retries"] for r in results),
            "output_tokens_per_s": tokens / seconds, "requests_per_s": len(results) / seconds,
            "ttft": summary([r["ttft"] for r in results]),
            "itl": summary([g for r in results for g in r["gaps"]])}


def _model(base_url: str, api_key: Optional[str]) -> str:
    import httpx
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(base_url + "/models", headers=headers, timeout=30).json()["data"][0]["id"]


def _v1(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _print_level(name: str, lv: dict[str, Any]) -> None:
    cpu = (f", CPU per token: API {lv['api_cpu_us_per_token']:.0f} us, engine "
           f"{lv['engine_cpu_us_per_token']:.0f} us" if "api_cpu_us_per_token" in lv else "")
    itl = f"{lv['itl']['median_ms']:.1f} ms" if lv["itl"]["median_ms"] else "-"
    print(f"{name}concurrency {lv['concurrency']:3d}: {lv['output_tokens_per_s']:8.1f} tok/s, "
          f"TTFT median {lv['ttft']['median_ms']:.0f} ms, ITL median {itl}{cpu}")


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm
    base_url = _v1(args.base_url)
    model = args.served_model or _model(base_url, args.api_key)
    peer_url = _v1(args.peer_url) if args.peer_url else None
    peer_model = (args.peer_model or _model(peer_url, args.peer_api_key)) if peer_url else None
    prompts = load_prompts(args.prompts, args.num_prompts)
    levels, peer_levels = [], []
    servers = 2 if peer_url else 1
    with tqdm(total=len(prompts) * len(args.concurrency) * servers, desc="requests",
              disable=args.no_progress) as bar:
        # Level by level, ours then the peer's, so a drift in the machine's load falls on both.
        for c in args.concurrency:
            levels.append(asyncio.run(_level(base_url, model, prompts, c, args, args.api_key,
                                             bar)))
            if peer_url:
                peer_levels.append(asyncio.run(_level(peer_url, peer_model, prompts, c, args,
                                                      args.peer_api_key, bar, False)))
    for lv in levels:
        _print_level("", lv)
    result = {"benchmark": "serve", "base_url": base_url, "model": model,
              "num_prompts": len(prompts), "max_tokens": args.max_tokens,
              "stream": args.stream, "levels": levels}
    if peer_url:
        for lv in peer_levels:
            _print_level("peer ", lv)
        result["peer"] = {"base_url": peer_url, "model": peer_model, "levels": peer_levels}
        result["ratios"] = [_ratio(ours, theirs) for ours, theirs in zip(levels, peer_levels)]
        for r in result["ratios"]:
            print(f"concurrency {r['concurrency']:3d}: {r['output_tokens_per_s']:.2f}x the "
                  f"peer's tok/s, TTFT {r['ttft_median']:.2f}x, ITL {r['itl_median']:.2f}x "
                  "(time ratios: below 1 is faster)")
        print("note: this client runs on the same machine as both servers, so it takes CPU time "
              "from whichever it measures; on a 2-core machine that weighs on every figure.")
    if args.plot:
        _plot(result, args.plot)
        result["plot"] = args.plot
    write_json(args.output_json, result)
    return result


def _ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    def div(a: float, b: float) -> float:
        return a / b if b else float("inf")
    return {"concurrency": ours["concurrency"],
            "output_tokens_per_s": div(ours["output_tokens_per_s"],
                                       theirs["output_tokens_per_s"]),
            "ttft_median": div(ours["ttft"]["median_ms"], theirs["ttft"]["median_ms"]),
            "itl_median": div(ours["itl"]["median_ms"], theirs["itl"]["median_ms"])}


def _plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    cs = [lv["concurrency"] for lv in result["levels"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(cs, [lv["output_tokens_per_s"] for lv in result["levels"]], marker="o")
    left.set(xlabel="concurrent requests", ylabel="output tokens/s", title="throughput")
    right.plot(cs, [lv["ttft"]["median_ms"] for lv in result["levels"]], marker="o",
               label="TTFT median")
    right.plot(cs, [lv["itl"]["median_ms"] for lv in result["levels"]], marker="s",
               label="ITL median")
    right.set(xlabel="concurrent requests", ylabel="ms", title="latency")
    right.legend()
    fig.suptitle(result["model"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="a running server at several concurrency levels")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--served-model", default=None, help="model name (default: the server's)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--peer-url", default=None,
                   help="another OpenAI-compatible server (e.g. llama-server) to run the same "
                        "client against, level by level; prints ours/peer ratios")
    p.add_argument("--peer-model", default=None, help="the peer's model name (default: its own)")
    p.add_argument("--peer-api-key", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream the answers (default), or ask for whole ones")
    p.add_argument("--server-pid", type=int, default=None,
                   help="the server's pid, on this machine: report the CPU time it and its "
                        "children spent per output token")
    p.add_argument("--plot", default=None, help="PNG file for the plot")
    p.add_argument("--no-progress", action="store_true")
    add_prompt_args(p)
    p.set_defaults(func=main)
