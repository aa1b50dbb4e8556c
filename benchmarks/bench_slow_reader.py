"""A client that stops reading (issue 45): what it costs the server, and the other streams.

One `tandem serve` (started here, from --repo: run it once on this checkout and once on an older
one for a before/after). A raw socket with a 4 KiB receive buffer asks for a stream of --tokens
tokens with 20 logprobs each (about 1.5 KB a token, so that the stream outgrows the kernel's
socket buffers and the server's writer must wait), reads its first kilobyte, then reads nothing for --pause seconds; meanwhile the server's
resident memory (the API process and its children: the engine core) is sampled every second, and
another client streams --probe-tokens tokens at the start, middle and end of the pause, against
the same stream measured before. Then the slow reader reads on, and says whether its stream
ended with [DONE], an error event, or a closed connection. A stream of the full length runs
first (--warmups of them, over a KV budget of --kv-cache), so that every KV block's pages are
resident before the memory is sampled; with --control the
reader reads as the stream comes (the same run without the stall: what the other stream's rate
is to be compared with).

  python benchmarks/bench_slow_reader.py                     # SmolLM2-135M, 4,096 tokens, 60 s
  python benchmarks/bench_slow_reader.py --repo /tmp/old     # another checkout's server
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

from tandem.bench.serve import descendants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_core import _start, _stop  # noqa: E402  (a server from a checkout)
from common import ROOT, SMOLLM2, save  # noqa: E402


def _rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory, MB: of the API process, and of all its descendants (the engine core)."""
    def rss(p: int) -> float:
        try:
            with open(f"/proc/{p}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
        except FileNotFoundError:
            return 0.0

    return rss(pid), sum(rss(c) for c in descendants(pid))


def _probe(url: str, tokens: int) -> float:
    """One streamed completion of `tokens` tokens: tokens/s."""
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for _ in r.iter_lines():
            pass
    return tokens / (time.perf_counter() - t0)


def _slow_reader(port: int, tokens: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.connect(("127.0.0.1", port))
    body = json.dumps({"prompt": "Write a very long story about a lighthouse keeper.",
                       "max_tokens": tokens, "ignore_eos": True, "stream": True,
                       "logprobs": 20})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
               ).encode())
    s.recv(1024)
    return s


def _drain(s: socket.socket, timeout_s: float) -> str:
    s.settimeout(timeout_s)
    data = b""
    try:
        while chunk := s.recv(1 << 16):
            data += chunk
            if b"data: [DONE]" in data[-64:]:
                break
    except socket.timeout:
        return "still open after the pause"
    if b'data: {"error"' in data:  # an error event (a token's text may be "error" itself)
        return "an error event"
    return "[DONE]" if b"data: [DONE]" in data else "closed by the server"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=str(ROOT))
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--pause", type=float, default=60.0)
    p.add_argument("--probe-tokens", type=int, default=256)
    p.add_argument("--kv-cache", default="256MiB",
                   help="the KV budget (SmolLM2: about 11k tokens in 256 MiB), used up by "
                        "--warmups streams before memory is sampled")
    p.add_argument("--warmups", type=int, default=3)
    p.add_argument("--port", type=int, default=8311)
    p.add_argument("--control", action="store_true",
                   help="the same run with a reader that reads as the stream comes (what "
                        "generating the stream costs by itself)")
    args = p.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    log = Path("/tmp/bench_slow_reader.log")
    proc = _start(Path(args.repo), args.model, args.tokens + 256, {}, args.port, log,
                  ["--kv-cache-memory-bytes", args.kv_cache])
    try:
        # Streams of the full length first, until every KV block has been used once: the KV
        # cache's pages become resident on first use (the engine's memory, not the reader's),
        # and a freed block goes to the back of the free queue, so one warm-up stream is not
        # enough for the measured stream to get touched blocks back.
        for _ in range(args.warmups):
            _probe(url, args.tokens)
        before = _probe(url, args.probe_tokens)
        time.sleep(2)
        api0, core0 = _rss_mb(proc.pid)
        rss0 = api0 + core0
        ending: list[str] = []
        s = _slow_reader(args.port, args.tokens)
        if args.control:
            reader = threading.Thread(target=lambda: ending.append(_drain(s, 600.0)))
            reader.start()
        t0 = time.monotonic()
        samples, during = [], []
        marks = [5.0, args.pause / 2, args.pause - 10.0]
        while (now := time.monotonic() - t0) < args.pause:
            api, core = _rss_mb(proc.pid)
            samples.append((round(now, 1), round(api - api0, 1), round(core - core0, 1)))
            if marks and now >= marks[0]:
                marks.pop(0)
                during.append(_probe(url, args.probe_tokens))
            time.sleep(1.0)
        peak = max(a + c for _, a, c in samples)
        if args.control:
            reader.join()
        else:
            ending.append(_drain(s, 120.0))
        s.close()
        result = {"repo": args.repo, "model": args.model, "tokens": args.tokens,
                  "pause_s": args.pause, "rss_before_mb": round(rss0, 1),
                  "growth_mb_at_end": round(samples[-1][1] + samples[-1][2], 1),
                  "api_growth_mb_at_end": samples[-1][1], "core_growth_mb_at_end": samples[-1][2],
                  "growth_mb_peak": round(peak, 1),
                  "probe_tok_s_before": round(before, 1),
                  "probe_tok_s_during": [round(x, 1) for x in during],
                  "control": args.control, "slow_stream_ended_with": ending[0],
                  "samples": samples}
    finally:
        _stop(proc)
    print(f"server RSS {rss0:.0f} MB before; while a reader of {args.tokens} tokens paused "
          f"{args.pause:.0f} s: +{result['growth_mb_at_end']} MB at the end (API process "
          f"+{result['api_growth_mb_at_end']}, engine core +{result['core_growth_mb_at_end']}), "
          f"+{result['growth_mb_peak']} MB at the peak")
    print(f"another stream of {args.probe_tokens} tokens: {before:.1f} tok/s before, "
          f"{', '.join(f'{x:.1f}' for x in during)} during the pause")
    print(f"the {'control' if args.control else 'paused'} stream ended with: {ending[0]}")
    print(save("slow-reader", result))


if __name__ == "__main__":
    main()
