"""`tandem bench throughput`: every prompt at once through the engine (offline batching), timed
end to end (output tokens over the whole run, prefill included) and as a batched generation rate
(the tokens after each request's first over the time after the last first token: what
llama-batched-bench reports as S_TG)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tandem.bench.common import (add_engine_args, load_prompts, make_llm, memory_line,
                                  positive_int, write_json)


def run_batch(engine: Any, prompts: list, params: Any, tag: str) -> dict[str, Any]:
    """Every prompt (token ids) queued at once, then steps to the end: the seconds end
    to end, the output tokens, and the generation phase (from the moment every request has its
    first token, which the prefill produces, to the end)."""
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    counts: dict[str, int] = {}
    first_all = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            counts[out.request_id] = sum(len(c.token_ids) for c in out.outputs)
        if first_all is None and len(counts) == len(prompts) and all(counts.values()):
            first_all = time.perf_counter()
    end = time.perf_counter()
    generated = sum(counts.values())
    after_first = generated - len(prompts) * params.n
    gen_seconds = end - first_all if first_all is not None else 0.0
    return {"seconds": end - t0, "generated": generated,
            "output_tokens_per_s": generated / (end - t0),
            "generation_tokens_per_s": after_first / gen_seconds if gen_seconds > 0 else None}


def fixed_length(tokenizer: Any, prompts: list[str], n: int) -> list[list[int]]:
    """Each prompt as exactly n token ids (its own tokens repeated, then cut): vLLM's
    --input-len, and llama-batched-bench's fixed prompt length, from real text."""
    out = []
    for p in prompts:
        ids = tokenizer.encode(p) or [0]
        out.append((ids * (n // len(ids) + 1))[:n])
    return out


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tandem import SamplingParams
    llm = make_llm(args)
    texts = load_prompts(args.prompts, args.num_prompts)
    tok = llm.llm_engine.tokenizer  # token ids once: the engine would encode the texts the same
    prompts = (fixed_length(tok, texts, args.input_len) if args.input_len
               else [tok.encode(t) for t in texts])
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=args.seed)
    run_batch(llm.llm_engine, prompts[:1], SamplingParams(max_tokens=4, temperature=0), "warm")
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):  # ours, then the peer, in each round
        entry = run_batch(llm.llm_engine, prompts, params, f"r{r}")
        generated = entry.pop("generated")
        if args.peers:
            # The yardstick: many prompts at once against one stream of transformers.
            from tandem.bench.peers import transformers_decode
            entry["transformers_single_stream"] = transformers_decode(
                args.model, texts[:2], args.max_tokens)["tokens_per_s"]
            entry["ratio"] = entry["output_tokens_per_s"] / entry["transformers_single_stream"]
        rounds.append(entry)
    seconds = statistics.median(e["seconds"] for e in rounds)
    prompt_tokens = sum(len(p) for p in prompts)
    rates = [e["generation_tokens_per_s"] for e in rounds if e["generation_tokens_per_s"]]
    result = {"benchmark": "throughput", "model": args.model,
              "speculative_config": json.loads(args.speculative_config)
              if args.speculative_config else None,
              "num_prompts": len(prompts), "max_tokens": args.max_tokens, "seconds": seconds,
              "requests_per_s": len(prompts) / seconds,
              "output_tokens_per_s": statistics.median(e["output_tokens_per_s"] for e in rounds),
              "generation_tokens_per_s": statistics.median(rates) if rates else None,
              "input_len": args.input_len,
              "total_tokens_per_s": (generated + prompt_tokens) / seconds, "rounds": rounds}
    if args.peers:
        single = statistics.median(e["transformers_single_stream"] for e in rounds)
        result["peers"] = {"transformers_generate_single_stream": {"tokens_per_s": single}}
        # The median of each round's own ratio, so the host's drift between rounds cancels.
        result["ratio_vs_transformers_single_stream"] = statistics.median(e["ratio"]
                                                                          for e in rounds)
    gen = result["generation_tokens_per_s"]
    print(f"throughput: {len(prompts)} prompts in {seconds:.2f} s, "
          f"{result['output_tokens_per_s']:.1f} output tok/s"
          + (f" ({gen:.1f} tok/s once every prompt was prefilled)" if gen else "")
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
    p.add_argument("--input-len", type=positive_int, default=None,
                   help="each prompt as exactly this many tokens (its text's tokens repeated), "
                        "as vLLM's benchmark and llama-batched-bench's -npp")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure R times, each round ours then the peer; report medians (the "
                        "ratio: the median of the per-round ratios)")
    p.set_defaults(func=main)
