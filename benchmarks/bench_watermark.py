"""Preemption under a full KV cache, with and without vLLM's `watermark` (core/scheduler.py).

C requests of N tokens at once (ignore_eos) in a KV cache that holds only a fraction of them at
their full length (--fill: the cache's tokens over the requests' final tokens), offline, each
run on a fresh engine, the watermarks taking turns round by round (the host drifts more than
policies differ). The prompts are the shared set cycled to C, so a prompt comes several times,
as in the serve benchmarks. Reports output tokens/s, preemptions and the wall time per run, and
the ratio of each watermark's tokens/s to the first one's (medians over rounds).

  python benchmarks/bench_watermark.py [--streams 32] [--tokens 1024] [--fill 0.35]
                                       [--watermarks 0 0.01 0.05] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SMOLLM2, prompts, save  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--fill", type=float, default=0.35,
                   help="the cache's tokens over what all requests hold at their full length")
    p.add_argument("--watermarks", type=float, nargs="+", default=[0.0, 0.01, 0.05])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if not 0.0 < args.fill <= 1.0:
        p.error(f"--fill must be in (0, 1], got {args.fill}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tandem import LLM, SamplingParams
    from tandem.worker.kv_cache import bytes_per_block, kv_formats

    texts = prompts(args.streams)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    probe = LLM(args.model, max_model_len=args.tokens + 128, seed=0)
    tok = probe.get_tokenizer()
    final = sum(len(tok(t).input_ids) + args.tokens for t in texts)
    engine = probe.llm_engine  # a block's bytes, as the engine sizes its cache
    block_size = engine.config.cache_config.block_size
    per_block = bytes_per_block([(engine.model, kv_formats(engine.config)["target"])],
                                block_size)
    budget = int(args.fill * final / block_size) * per_block
    del probe, engine

    def fresh(w: float) -> LLM:
        # A fresh engine for every run: an engine's prefix cache keeps the last run's blocks,
        # and a second run of the same prompts would share them from its first step.
        return LLM(args.model, max_model_len=args.tokens + 128, seed=0, watermark=w,
                   kv_cache_memory_bytes=budget)

    print(f"{args.streams} x {args.tokens} tokens, {final} tokens in all, a cache of "
          f"{budget / 2**20:.1f} MiB ({args.fill:.2f} of them)", flush=True)

    def preemptions(llm) -> int:
        return int(next(m.value for m in llm.get_metrics() if m.name == "tandem:num_preemptions"))

    runs: dict[float, list[dict]] = {w: [] for w in args.watermarks}
    for r in range(args.rounds):
        order = args.watermarks if r % 2 == 0 else args.watermarks[::-1]
        for w in order:
            llm = fresh(w)
            t0 = time.perf_counter()
            outs = llm.generate(texts, params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            runs[w].append({"tok_s": tokens / seconds, "seconds": seconds,
                            "preemptions": preemptions(llm)})
            del llm
            print(f"round {r + 1}, watermark {w:.3f}: {tokens / seconds:7.1f} tok/s, "
                  f"{runs[w][-1]['preemptions']} preemptions, {seconds:.0f} s", flush=True)
    base = args.watermarks[0]
    rows = []
    for w in args.watermarks:
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(runs[w], runs[base])]
        rows.append({"watermark": w, "tok_s": median(x["tok_s"] for x in runs[w]),
                     "preemptions": median(x["preemptions"] for x in runs[w]),
                     "over_first": median(ratios), "rounds": runs[w]})
        print(f"watermark {w:.3f}: {rows[-1]['tok_s']:7.1f} tok/s, "
              f"{rows[-1]['preemptions']:.0f} preemptions, {rows[-1]['over_first']:.2f}x "
              f"watermark {base:.3f}", flush=True)
    print(save("watermark", {"model": args.model, "streams": args.streams,
                             "tokens": args.tokens, "fill": args.fill, "budget_bytes": budget,
                             "rows": rows}))


if __name__ == "__main__":
    main()
