"""`tandem bench throughput`: every prompt at once through `LLM.generate` (offline batching)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tandem.bench.common import (add_engine_args, load_prompts, make_llm, memory_line,
                                  positive_int, write_json)


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tandem import SamplingParams
    llm = make_llm(args)
    prompts = load_prompts(args.prompts, args.num_prompts)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=args.seed)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):  # ours, then the peer, in each round
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        generated = sum(len(c.token_ids) for o in outs for c in o.outputs)
        entry = {"seconds": seconds, "output_tokens_per_s": generated / seconds}
        if args.peers:
            # The yardstick: many prompts at once against one stream of transformers.
            from tandem.bench.peers import transformers_decode
            entry["transformers_single_stream"] = transformers_decode(
                args.model, prompts[:2], args.max_tokens)["tokens_per_s"]
            entry["ratio"] = entry["output_tokens_per_s"] / entry["transformers_single_stream"]
        rounds.append(entry)
    seconds = statistics.median(e["seconds"] for e in rounds)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    result = {"benchmark": "throughput", "model": args.model,
              "speculative_config": json.loads(args.speculative_config)
              if args.speculative_config else None,
              "num_prompts": len(prompts), "max_tokens": args.max_tokens, "seconds": seconds,
              "requests_per_s": len(prompts) / seconds,
              "output_tokens_per_s": statistics.median(e["output_tokens_per_s"] for e in rounds),
              "total_tokens_per_s": (generated + prompt_tokens) / seconds, "rounds": rounds}
    if args.peers:
        single = statistics.median(e["transformers_single_stream"] for e in rounds)
        result["peers"] = {"transformers_generate_single_stream": {"tokens_per_s": single}}
        # The median of each round's own ratio, so the host's drift between rounds cancels.
        result["ratio_vs_transformers_single_stream"] = statistics.median(e["ratio"]
                                                                          for e in rounds)
    print(f"throughput: {len(prompts)} prompts in {seconds:.2f} s, "
          f"{result['output_tokens_per_s']:.1f} output tok/s"
          + (f", {result['ratio_vs_transformers_single_stream']:.2f}x transformers' single "
             "stream" if args.peers else ""))
    print(memory_line())
    write_json(args.output_json, result)
    return result


def add_parser(sub: Any) -> None:
    p = sub.add_parser("throughput", help="many prompts offline: tokens/s")
    add_engine_args(p)
    p.add_argument("--peers", action="store_true",
                   help="also time one stream of transformers' generate in the same run")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure R times, each round ours then the peer; report medians (the "
                        "ratio: the median of the per-round ratios)")
    p.set_defaults(func=main)
