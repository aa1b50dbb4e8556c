"""A draft model with a lookup beside it (`draft+suffix`, `draft+ngram`) against each alone, paired
request by request on a mixed workload.

`bench_model_free.py --mixed` times each method in an engine of its own, one method after
another; there its rounds moved by more than the methods differed (benchmarks/LOG.md,
2026-12-06). Here every engine is built first (plain decoding and each method, all in this
process, each with a small KV cache), and every request of the mixed workload (the repetitive
prompts and the free-text ones in turn) runs on each engine, one after another, in an order
rotated per request and per round, so the host's drift falls on every method alike. A method's
figure for a round is its decode rate over all the round's requests (tokens after each first
token over the time they took) against plain's over the same requests; the figure is the median
over rounds, beside it the same for the repetitive and the free-text halves, and per request the
better of the lookup alone and the draft alone (what a perfect choice per request would get).

Each round starts every speculating engine's controller afresh (`set_policy`, as
bench_model_free.py does) and empties the suffix trees: the rounds rerun the same prompts.
Greedy, `ignore_eos`, `--max-tokens` each.

    python benchmarks/bench_combination.py --rounds 4
    python benchmarks/bench_combination.py --model gemma3 --methods ngram draft draft+ngram
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model_free import (DRAFTS, add_pair_args, clear_suffix_cache,  # noqa: E402
                                         method_config, model_path, repetitive_prompts,
                                         run_batch, synthetic_label)
from benchmarks.common import prompts as free_prompts, save  # noqa: E402
from tandem.bench.common import cpu_name  # noqa: E402

KV_BYTES = 512 * 1024**2  # per engine: four engines of the synthetic pair stay in memory


def one_request(llm: Any, prompt: str, params: Any, tag: str) -> tuple[int, float]:
    """One request alone on `llm`'s engine: (tokens after the first, seconds they took)."""
    run = run_batch(llm.llm_engine, [prompt], params, 1, tag)
    return run["decode_tokens"], run["decode_seconds"]


def rate(runs: list[tuple[int, float]]) -> float:
    return sum(n for n, _ in runs) / max(sum(s for _, s in runs), 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic", choices=sorted(DRAFTS))
    ap.add_argument("--methods", nargs="+", default=["suffix", "draft", "draft+suffix"],
                    choices=["ngram", "suffix", "draft", "draft+ngram", "draft+suffix"])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=4,
                    help="repetitive prompts, and as many free-text ones")
    add_pair_args(ap)
    args = ap.parse_args()
    from tandem import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    repetitive = repetitive_prompts(args.model)[:args.num_prompts]
    free = free_prompts(args.num_prompts)
    mixed = [(p, half) for pair in zip(repetitive, free)
             for p, half in zip(pair, ("repetitive", "free text"))]
    target = model_path(args.model, args)
    configs = {m: method_config(args.model, m, args.draft_k) for m in args.methods}
    print(f"CPU: {cpu_name()}; {args.model}, {len(mixed)} requests x {args.max_tokens} tokens, "
          f"{args.rounds} rounds", flush=True)
    engines = {name: LLM(target, max_model_len=4096, enable_prefix_caching=False,
                         kv_cache_memory_bytes=KV_BYTES, speculative_config=config)
               for name, config in {"plain": None, **configs}.items()}
    for llm in engines.values():  # warm-up: first calls of every kernel
        one_request(llm, repetitive[0], SamplingParams(max_tokens=8), "warm")
    names = list(engines)
    # runs[round][name][request index] = (decode tokens, seconds)
    runs: list[dict[str, list[tuple[int, float]]]] = []
    for r in range(args.rounds):
        for name, config in configs.items():
            engines[name].llm_engine.drafting.set_policy(config["num_speculative_tokens"],
                                                         adaptive=True)
            clear_suffix_cache(engines[name])
        this: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
        for i, (prompt, _) in enumerate(mixed):
            shift = (i + r) % len(names)
            for name in names[shift:] + names[:shift]:
                this[name].append(one_request(engines[name], prompt, params, f"{name}-{r}-{i}"))
        runs.append(this)
        print(f"round {r + 1}: " + ", ".join(
            f"{m} {rate(this[m]) / rate(this['plain']):.2f}x" for m in configs), flush=True)

    def ratios(name: str, keep: set[int]) -> list[float]:
        return [rate([x for i, x in enumerate(run[name]) if i in keep])
                / rate([x for i, x in enumerate(run["plain"]) if i in keep]) for run in runs]

    halves = {"all": set(range(len(mixed)))}
    for half in ("repetitive", "free text"):
        halves[half] = {i for i, (_, h) in enumerate(mixed) if h == half}
    alone = [m for m in configs if "+" not in m]
    if len(alone) == 2:  # the better method alone per request, in each round
        for run in runs:
            run["best alone"] = [max((run[m][i] for m in alone), key=lambda x: x[0] / x[1])
                                 for i in range(len(mixed))]
    results: dict[str, Any] = {"cpu": cpu_name(), "model": args.model, "rounds": args.rounds,
                               "max_tokens": args.max_tokens, "requests": len(mixed),
                               "methods": {}}
    if args.model == "synthetic":
        results["synthetic_pair"] = synthetic_label(args)
    print(f"plain: {statistics.median(rate(run['plain']) for run in runs):.1f} tok/s (median)")
    for name in [n for n in runs[0] if n != "plain"]:
        row = {half: {"speedup": statistics.median(ratios(name, keep)),
                      "by_round": ratios(name, keep)} for half, keep in halves.items()}
        results["methods"][name] = row
        print(f"{name:13s} " + "; ".join(
            f"{half} {v['speedup']:.2f}x ({', '.join(f'{x:.2f}' for x in v['by_round'])})"
            for half, v in row.items()), flush=True)
    print(f"written to {save('combination', results)}")


if __name__ == "__main__":
    main()
