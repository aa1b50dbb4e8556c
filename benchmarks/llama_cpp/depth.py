"""Long context against llama.cpp (issue 43): one GGUF file, decoding after a deep prompt and
prefilling a long one, per KV cache format, side by side in one run.

    /work/main/.venv/bin/python benchmarks/llama_cpp/depth.py [FILE] [--depths 64 4096]
        [--formats f16 q8_0] [--prefill 512 4096] [--rounds 1] [--threads 2]

FILE defaults to the SmolLM2-1.7B-shaped Q4_K_M (files.py --large: larger than any L3 here).
- decode: llama-bench `-n 64 -d D -fa 1 -ctk F -ctv F` (64 tokens after a context of D) against
  tandem decoding 64 greedy tokens after a D-token prompt, `kv_cache_dtype` F (f16 = float16),
  its generation rate (the tokens after the first).
- prefill: llama-bench `-p P -n 0 -fa 1 -ctk F -ctv F` against tandem's time to the first token
  of a P-token prompt (one request, max_tokens 1), tokens/s, per format.
In each round the two engines alternate, format by format. Threads: both sides --threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from files import llama_bin, smollm2_1p7b_shaped_q4_k_m  # noqa: E402
from peer import lscpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "llama_cpp"
TANDEM_FORMAT = {"f16": "float16", "q8_0": "q8_0", "bf16": "bfloat16", "f32": "float32"}


def llama_bench(file: Path, threads: int, args: list[str]) -> float:
    out = subprocess.run([str(llama_bin() / "llama-bench"), "-m", str(file), "-t", str(threads),
                          "-r", "1", "-o", "json", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama-bench failed: {out.stderr[-2000:]}")
    (row,) = json.loads(out.stdout)
    return float(row["avg_ts"])


def tandem_prompt(tok, depth: int) -> list[int]:
    from tandem.bench.throughput import fixed_length
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import prompts
    return fixed_length(tok, [" ".join(prompts(400))], depth)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", default=None)
    p.add_argument("--depths", type=int, nargs="+", default=[64, 4096])
    p.add_argument("--formats", nargs="+", default=["f16", "q8_0"])
    p.add_argument("--prefill", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    file = Path(args.file) if args.file else smollm2_1p7b_shaped_q4_k_m()
    from tandem import LLM, SamplingParams
    from tandem.bench.throughput import run_batch
    top = max(args.depths + args.prefill) + 128
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the 1.7B file says 8,192
    llms = {f: LLM(str(file), kv_cache_dtype=TANDEM_FORMAT[f], seed=0, max_model_len=top,
                   enable_prefix_caching=False, max_num_batched_tokens=top)
            for f in args.formats}
    tok = llms[args.formats[0]].llm_engine.tokenizer
    decode = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rates: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        rates.setdefault(key, []).append(value)
        print(f"  {key}: {value:.2f} tok/s", flush=True)

    for r in range(args.rounds):
        for depth in args.depths:
            ids = tandem_prompt(tok, depth)
            for f in args.formats:
                note(f"llama decode d{depth} {f}", llama_bench(
                    file, args.threads, ["-p", "0", "-n", "64", "-d", str(depth), "-fa", "1",
                                         "-ctk", f, "-ctv", f]))
                got = run_batch(llms[f].llm_engine, ids, decode, f"d{depth}-{f}-{r}")
                note(f"tandem decode d{depth} {f}", got["generation_tokens_per_s"])
        for n in args.prefill:
            ids = tandem_prompt(tok, n)
            for f in args.formats:
                note(f"llama prefill {n} {f}", llama_bench(
                    file, args.threads, ["-p", str(n), "-n", "0", "-fa", "1", "-ctk", f, "-ctv",
                                         f]))
                t0 = time.perf_counter()
                run_batch(llms[f].llm_engine, ids, first, f"p{n}-{f}-{r}")
                note(f"tandem prefill {n} {f}", n / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    info, _ = lscpu()
    print(f"\n{info.get('Model name')} (family {info.get('CPU family')} model "
          f"{info.get('Model')}), {args.threads} threads, {file.name}")
    for depth in args.depths:
        for f in args.formats:
            t, ll = med[f"tandem decode d{depth} {f}"], med[f"llama decode d{depth} {f}"]
            print(f"decode at depth {depth}, {f} cache: tandem {t:.2f}, llama.cpp {ll:.2f} "
                  f"tok/s ({t / ll:.2f}x)")
    for f in args.formats:
        lo, hi = min(args.depths), max(args.depths)
        print(f"tandem decode depth {hi} / depth {lo}, {f}: "
              f"{med[f'tandem decode d{hi} {f}'] / med[f'tandem decode d{lo} {f}']:.2f}x "
              f"(llama.cpp {med[f'llama decode d{hi} {f}'] / med[f'llama decode d{lo} {f}']:.2f}x)")
    lo, hi = min(args.prefill), max(args.prefill)
    for f in args.formats:
        for n in args.prefill:
            t, ll = med[f"tandem prefill {n} {f}"], med[f"llama prefill {n} {f}"]
            print(f"prefill {n}, {f} cache: tandem {t:.1f}, llama.cpp {ll:.1f} tok/s "
                  f"({t / ll:.2f}x)")
        print(f"tandem prefill {hi} / {lo}, {f}: "
              f"{med[f'tandem prefill {hi} {f}'] / med[f'tandem prefill {lo} {f}']:.2f}x "
              f"(llama.cpp {med[f'llama prefill {hi} {f}'] / med[f'llama prefill {lo} {f}']:.2f}x)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "depth.json"
    out.write_text(json.dumps({"cpu": info.get("Model name"), "family": info.get("CPU family"),
                               "model": info.get("Model"), "file": str(file),
                               "threads": args.threads, "rates": rates, "medians": med},
                              indent=2))
    print(out)


if __name__ == "__main__":
    main()
