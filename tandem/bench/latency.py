"""`tandem bench latency`: one stream at a time. Time to first token, inter-token latency (the
gap between steps that deliver tokens; a verify step may deliver several) and tokens/s, measured
on the engine's own step loop. `--rounds R` repeats ours and the peers R times, interleaved."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tandem.bench.common import (add_engine_args, load_prompts, make_llm, positive_int, summary,
                                  memory_line, write_json)


def run_one(engine: Any, prompt: str, params: Any, request_id: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    arrivals: list[tuple[float, int]] = []  # (time, tokens so far) at each delivering step
    count = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            n = len(out.outputs[0].token_ids)
            if n > count:
                count = n
                arrivals.append((time.perf_counter(), n))
    end = time.perf_counter()
    ttft = arrivals[0][0] - t0 if arrivals else end - t0
    gaps = [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
    return {"ttft": ttft, "gaps": gaps, "tokens": count, "seconds": end - t0,
            "decode_seconds": end - arrivals[0][0] if arrivals else 0.0}


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tandem import SamplingParams
    t0 = time.perf_counter()
    llm = make_llm(args)
    engine = llm.llm_engine
    prompts = load_prompts(args.prompts, args.num_prompts)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=args.seed)
    warm = run_one(engine, prompts[0], SamplingParams(max_tokens=4, temperature=0), "warmup")
    startup = time.perf_counter() - t0 - (warm["seconds"] - warm["ttft"])  # to a first token
    draft = (json.loads(args.speculative_config) or {}).get("model") \
        if args.speculative_config else None
    rounds: list[dict[str, Any]] = []
    all_runs: list[dict[str, Any]] = []
    for r in range(args.rounds):  # ours, then the peers, in each round
        runs = [run_one(engine, p, params, f"r{r}-{i}") for i, p in enumerate(prompts)]
        all_runs += runs
        decode_tokens = sum(x["tokens"] - 1 for x in runs)
        entry = {"decode_tokens_per_s": decode_tokens / max(sum(x["decode_seconds"]
                                                                for x in runs), 1e-9)}
        if args.peers:
            from tandem.bench.peers import transformers_decode
            entry["transformers_generate"] = transformers_decode(args.model, prompts,
                                                                 args.max_tokens)["tokens_per_s"]
            if draft:
                entry["transformers_assisted"] = transformers_decode(
                    args.model, prompts, args.max_tokens, draft)["tokens_per_s"]
            entry["ratio_vs_transformers"] = (entry["decode_tokens_per_s"]
                                              / entry["transformers_generate"])
        rounds.append(entry)
    tokens = sum(x["tokens"] for x in all_runs)
    decode_tokens = sum(x["tokens"] - 1 for x in all_runs)
    result: dict[str, Any] = {
        "benchmark": "latency", "model": args.model,
        "speculative_config": json.loads(args.speculative_config)
        if args.speculative_config else None,
        "num_prompts": len(prompts), "max_tokens": args.max_tokens,
        "startup_to_first_token_s": startup,
        "ttft": summary([x["ttft"] for x in all_runs]),
        "itl": summary([g for x in all_runs for g in x["gaps"]]),
        "tpot_ms": 1000 * sum(x["decode_seconds"] for x in all_runs) / max(decode_tokens, 1),
        "tokens_per_s": tokens / sum(x["seconds"] for x in all_runs),
        "decode_tokens_per_s": statistics.median(e["decode_tokens_per_s"] for e in rounds),
        "rounds": rounds,
    }
    if args.peers:
        # Medians over rounds; the ratio is the median of each round's own ratio, so the host's
        # drift between rounds cancels.
        peer = {"transformers_generate": {"tokens_per_s": statistics.median(
            e["transformers_generate"] for e in rounds)}}
        if draft:
            peer["transformers_assisted"] = {"tokens_per_s": statistics.median(
                e["transformers_assisted"] for e in rounds)}
        result["peers"] = peer
        result["ratio_vs_transformers"] = statistics.median(e["ratio_vs_transformers"]
                                                            for e in rounds)
    print(f"latency: TTFT mean {result['ttft']['mean_ms']:.1f} ms, ITL mean "
          f"{result['itl']['mean_ms']:.1f} ms, decode {result['decode_tokens_per_s']:.1f} tok/s"
          + (f", {result['ratio_vs_transformers']:.2f}x transformers" if args.peers else ""))
    print(memory_line())
    write_json(args.output_json, result)
    return result


def add_parser(sub: Any) -> None:
    p = sub.add_parser("latency", help="one stream: TTFT, ITL, tokens/s")
    add_engine_args(p)
    p.add_argument("--peers", action="store_true",
                   help="also time transformers' generate (and assisted generation with the "
                        "draft) in the same run")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure R times, each round ours then the peers; report medians (the "
                        "ratio: the median of the per-round ratios)")
    p.set_defaults(func=main)
