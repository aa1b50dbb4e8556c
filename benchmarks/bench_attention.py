"""The CPU paged-attention kernel alone (kernels/cpu_attention.c), one layer of a model's shape:
a causal prefill of N tokens, or Q queries (a decode, a verification) at depth N, per cache
format; with --against, another checkout's kernel beside this one's, called alternately in one
process (the host drifts more than two kernels differ), the median of the per-round ratios, and
their outputs compared bit for bit.

    .venv/bin/python benchmarks/bench_attention.py --shape 32:32:64 --tokens 2048 \
        --formats float16 q8_0 [--queries 9] [--threads 2] [--rounds 9] [--against /tmp/old]

--shape is HEADS:KV_HEADS:HEAD_DIM (32:32:64 the SmolLM2-1.7B shape, 32:8:128 Qwen3-8B's,
9:3:64 SmolLM2-135M's, 4:1:256 Gemma 3 270M's). Multiply-adds counted: the causal scores and
value sums, 2 H D per (query, key) pair. A kernel-level figure: the engine's speeds come from
`tandem bench` and benchmarks/llama_cpp/depth.py.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "llama_cpp"))

from peer import cpu, cpu_line  # noqa: E402

from tandem.attention.kv_format import FORMATS  # noqa: E402
from tandem.attention.metadata import build_attention_metadata  # noqa: E402
from tandem.kernels import cpu as cpu_kernels  # noqa: E402


def library(repo: Path) -> ctypes.CDLL:
    """The kernel library of checkout `repo`, built (or found in the cache) by its own code,
    with OpenMP as the engine builds it: torch is imported first, since the build links OpenMP
    only into a process that has torch's libgomp loaded (without it, a serial library, and
    --threads would change nothing)."""
    code = (f"import sys, torch; sys.path.insert(0, {str(repo)!r}); "
            "from tandem.kernels.cpu_build import build_library; print(build_library())")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True)
    lib = ctypes.CDLL(out.stdout.strip().splitlines()[-1])
    lib.tandem_paged_attention.restype = ctypes.c_int
    return lib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="32:32:64")
    p.add_argument("--tokens", type=int, default=2048, help="keys (the depth)")
    p.add_argument("--queries", type=int, default=None, help="default: --tokens (a prefill)")
    p.add_argument("--formats", nargs="+", default=["float16", "q8_0"], choices=sorted(FORMATS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--against", default=None, help="another checkout's kernel, timed alongside")
    args = p.parse_args()
    h, hkv, d = (int(x) for x in args.shape.split(":"))
    n, ql = args.tokens, args.queries or args.tokens
    libs = {"this": library(ROOT)}
    if args.against:
        libs["against"] = library(Path(args.against).resolve())
    block = 16
    meta = build_attention_metadata([ql], [n], [list(range(1, n // block + 2))], block,
                                    torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(ql, h, d, generator=g)  # [Q, H, D]
    keys = torch.randn(n + block, hkv, d, generator=g)  # [slots, Hkv, D]
    values = torch.randn(keys.shape, generator=g)
    fma = 2 * h * d * (n * (n + 1) / 2 - (n - ql) * (n - ql + 1) / 2)
    print(f"{cpu_line(cpu())}; {args.threads} threads; shape {args.shape}, {ql} queries at "
          f"{n} keys")
    for name in args.formats:
        fmt = FORMATS[name]
        kc, vc = fmt.store(keys), fmt.store(values)
        outs = {k: torch.empty(q.shape) for k in libs}
        P, I = ctypes.c_void_p, ctypes.c_int64

        def call(which: str) -> float:
            t0 = time.perf_counter()
            rc = libs[which].tandem_paged_attention(
                P(q.data_ptr()), I(q.stride(0)), P(kc.data_ptr()), P(vc.data_ptr()),
                P(outs[which].data_ptr()), P(meta.requests.data_ptr()),
                P(meta.kv_slots.data_ptr()), I(1), I(meta.kv_slots.shape[1]), I(h), I(hkv),
                I(d), ctypes.c_float(d ** -0.5), I(0), ctypes.c_float(0.0),
                ctypes.c_int(cpu_kernels._kv_code(kc, vc)), ctypes.c_int(args.threads))
            if rc != 0:
                raise SystemExit(f"the kernel refused shape {args.shape} / {name}")
            return time.perf_counter() - t0

        times: dict[str, list[float]] = {k: [] for k in libs}
        for r in range(args.rounds + 1):  # round 0 warms up
            for k in (libs if r % 2 else reversed(list(libs))):
                dt = call(k)
                if r:
                    times[k].append(dt)
        this = statistics.median(times["this"])
        line = f"{name}: {this * 1e3:.1f} ms, {fma / this / 1e9:.1f} G multiply-adds/s"
        if "against" in libs:
            ratios = [a / b for a, b in zip(times["against"], times["this"])]
            same = torch.equal(outs["this"], outs["against"])
            line += (f"; against {statistics.median(times['against']) * 1e3:.1f} ms: "
                     f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-"
                     f"{max(ratios):.2f}), {'same bits' if same else 'BITS DIFFER'}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
