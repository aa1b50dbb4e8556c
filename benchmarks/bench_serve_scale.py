"""The server at scale (issue 45): `tandem serve` at several stream counts and output lengths,
against the offline engine on the same shapes, with what the API process itself costs per token.

For each output length (--lengths) and stream count C (--streams): C requests of that many tokens
at once (ignore_eos), through HTTP with the lean client of `tandem bench serve` (streamed, and
with --no-stream-too also whole), and through the offline `LLM` in this process (idle while the
server is measured): output tokens/s, the ratio served/offline, and the CPU time per output token
of the API process and of the engine core process (from /proc). The API's per-token cost should
not grow with the output's length. With --rounds R each level runs offline and served R times,
alternating (after one unmeasured run of each), and reports the medians: the host drifts by more
than one stream's difference.

With --peer-url the same client also runs each level against another server (llama-server:
`python benchmarks/llama_cpp/peer.py server smollm2-q4_1 --parallel 256 --ctx-per-slot 2304`);
with --peer-only it runs against that server alone, so a long level (256 x 2,048 takes hours on
two cores) can be split into two runs, tandem's and the peer's.

  python benchmarks/bench_serve_scale.py [--streams 1 16 64] [--lengths 128 2048] [--no-stream-too]
                                         [--peer-url http://127.0.0.1:8090 [--peer-only]]
                                         [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_core import _start, _stop  # noqa: E402
from common import ROOT, SMOLLM2, prompts, save  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 2048])
    p.add_argument("--no-stream-too", action="store_true")
    p.add_argument("--peer-url", default=None,
                   help="another server (e.g. llama-server from llama_cpp/peer.py server) that "
                        "the same client also measures at each level")
    p.add_argument("--peer-only", action="store_true",
                   help="measure only --peer-url: no tandem server, no offline engine")
    p.add_argument("--port", type=int, default=8312)
    p.add_argument("--repo", default=str(ROOT))
    p.add_argument("--rounds", type=int, default=1,
                   help="alternating offline and served runs per level (medians reported)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.peer_only and not args.peer_url:
        p.error("--peer-only measures the server at --peer-url, and none was given")
    if args.peer_only:
        return peer_only(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tandem import LLM, SamplingParams
    from tandem.bench.serve import _level
    top = max(args.lengths) + 128
    log = Path("/tmp/bench_serve_scale.log")
    proc = _start(Path(args.repo), args.model, top, {}, args.port, log)
    llm = LLM(args.model, max_model_len=top, seed=0)
    rows = []
    try:
        for n in args.lengths:
            for c in args.streams:
                texts = prompts(c)
                params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

                def offline() -> float:
                    t0 = time.perf_counter()
                    llm.generate(texts, params, use_tqdm=False)
                    return c * n / (time.perf_counter() - t0)

                for stream in [True, False] if args.no_stream_too else [True]:
                    ns = argparse.Namespace(max_tokens=n, temperature=0.0, stream=stream,
                                            server_pid=proc.pid)

                    def served() -> dict:
                        return asyncio.run(_level(f"http://127.0.0.1:{args.port}/v1",
                                                  args.model, texts, c, ns, None, _NoBar()))

                    if args.rounds > 1:  # unmeasured: caches, the server's first requests
                        offline(), served()
                    rounds = [(offline(), served()) for _ in range(args.rounds)]
                    ratios = [lv["output_tokens_per_s"] / off for off, lv in rounds]
                    row = {"tokens": n, "streams": c, "stream": stream, "rounds": args.rounds,
                           "served_tok_s": median(lv["output_tokens_per_s"] for _, lv in rounds),
                           "offline_tok_s": median(off for off, _ in rounds),
                           "ratio": median(ratios), "ratios": ratios,
                           "api_cpu_us_per_token": median(lv["api_cpu_us_per_token"]
                                                          for _, lv in rounds),
                           "engine_cpu_us_per_token": median(lv["engine_cpu_us_per_token"]
                                                             for _, lv in rounds)}
                    offline_rate = row["offline_tok_s"]
                    if args.peer_url:
                        peer = _peer_level(args.peer_url, texts, c, ns)
                        row["peer_tok_s"] = peer["output_tokens_per_s"]
                        row["over_peer"] = row["served_tok_s"] / row["peer_tok_s"]
                    rows.append(row)
                    print(f"{n:5d} tokens x {c:3d} {'streams' if stream else 'whole  '}: served "
                          f"{row['served_tok_s']:7.1f} tok/s, offline {offline_rate:7.1f} "
                          f"({row['ratio']:.2f}x" + (
                              f", rounds {' '.join(f'{r:.2f}' for r in ratios)}"
                              if args.rounds > 1 else "") + "); CPU per token: API "
                          f"{row['api_cpu_us_per_token']:.0f} us, engine "
                          f"{row['engine_cpu_us_per_token']:.0f} us" + (
                              f"; peer {row['peer_tok_s']:7.1f} tok/s ({row['over_peer']:.2f}x)"
                              if args.peer_url else ""), flush=True)
    finally:
        _stop(proc)
    print(save("serve-scale", {"model": args.model, "rows": rows}))
    print(json.dumps(rows[-1]))


def _peer_level(url: str, texts: list[str], c: int, ns: argparse.Namespace) -> dict:
    """One level against the peer server with tandem bench serve's client."""
    from tandem.bench.serve import _level
    return asyncio.run(_level(url.rstrip("/") + "/v1", "peer", texts, c, ns, None, _NoBar(),
                              server_pid_applies=False))


def peer_only(args: argparse.Namespace) -> None:
    """Each level against the peer alone, with the client and prompts of the full run."""
    rows = []
    for n in args.lengths:
        for c in args.streams:
            for stream in [True, False] if args.no_stream_too else [True]:
                ns = argparse.Namespace(max_tokens=n, temperature=0.0, stream=stream)
                peer = _peer_level(args.peer_url, prompts(c), c, ns)
                rows.append({"tokens": n, "streams": c, "stream": stream,
                             "peer_tok_s": peer["output_tokens_per_s"],
                             "seconds": peer["seconds"]})
                print(f"{n:5d} tokens x {c:3d} {'streams' if stream else 'whole  '}: peer "
                      f"{peer['output_tokens_per_s']:7.1f} tok/s in {peer['seconds']:.0f} s",
                      flush=True)
    print(save("serve-scale-peer", {"peer_url": args.peer_url, "rows": rows}))


class _NoBar:
    def update(self, n: int) -> None:
        pass


if __name__ == "__main__":
    main()
