"""`tandem bench spec`: what speculation buys, over a range of k, single stream.

For each k: acceptance by draft position (P(position i accepted), from the engine's counters;
for adaptive, the share of drafting steps that had position i accepted, drafted or not),
mean acceptance length, and the measured speedup over plain decoding of the target, against the
standard model's prediction E(k) / (k c + 1), where E(k) = 1 + sum_i P(position i accepted) is
the expected tokens per verify step and c the draft/target cost ratio (their plain decode times
per token, measured here). `--adaptive` adds a run with adaptive speculation (k chosen per step,
up to the largest k) twice: "fresh", a controller that starts every run from the engine's
load-time calibration (what a fresh engine meets: each run is a few short requests), and "warm",
one controller kept across the rounds (a long-running server). The plot: acceptance by position,
and measured vs predicted speedup vs k.

Every policy (plain decoding, each k, adaptive) runs on one engine, switched between runs
(`Drafting.set_policy`; plain is drafting off). Run as separate engines, the same configuration
differed by up to 15% between processes on a shared machine, more than the differences being
measured (a fixed k and adaptive came out 0.76x in one such run and 0.98x when paired in one
process). `--rounds R` measures every policy R times, with plain decoding at the start and end of
each round; each speedup is the median over rounds of the ratio to that round's plain rate (the
mean of its two runs), so drift over minutes cancels within a round. The draft/target cost ratio
c comes from an engine of each model alone, once per round.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from typing import Any

from tandem.bench.common import (add_prompt_args, add_weight_args, load_prompts, make_llm,
                                  memory_line, positive_int, pyplot, write_json)
from tandem.bench.latency import run_one
from tandem.spec_decode.model_free_config import MODEL_FREE_METHODS, infer_method


def _counters(llm: Any) -> tuple[int, int, list[int]]:
    m = {x.name: x for x in llm.get_metrics()}
    if "tandem:spec_decode_num_drafts" not in m:
        return 0, 0, []
    return (m["tandem:spec_decode_num_drafts"].value,
            m["tandem:spec_decode_num_accepted_tokens"].value,
            list(m["tandem:spec_decode_num_accepted_tokens_per_pos"].values))


def _decode_rate(llm: Any, prompts: list[str], params: Any
                 ) -> tuple[float, list[float], float]:
    """Single-stream tokens/s, and (from the counters of the timed runs only) acceptance by
    position and mean acceptance length."""
    engine = llm.llm_engine
    drafts0, accepted0, per_pos0 = _counters(llm)
    runs = [run_one(engine, p, params, f"r{i}") for i, p in enumerate(prompts)]
    drafts, accepted, per_pos = _counters(llm)
    rate = sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)
    n = drafts - drafts0
    if n == 0:
        return rate, [], 1.0
    return (rate, [(a - b) / n for a, b in zip(per_pos, per_pos0)],
            1 + (accepted - accepted0) / n)


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tandem import SamplingParams
    spec = json.loads(args.speculative_config)
    model_free = isinstance(spec, dict) and infer_method(spec) in MODEL_FREE_METHODS
    if not isinstance(spec, dict) or ("model" not in spec and not model_free):
        raise SystemExit("tandem bench spec needs --speculative-config with a draft 'model', or "
                         f"a method of {list(MODEL_FREE_METHODS)}")
    if "adaptive" in spec or "num_speculative_tokens" in spec:
        raise SystemExit("tandem bench spec varies num_speculative_tokens (--k) and adaptive "
                         "(--adaptive) itself; leave them out of --speculative-config")
    prompts = load_prompts(args.prompts, args.num_prompts)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=args.seed)
    warmup = SamplingParams(max_tokens=4, temperature=0)

    def alone(model: str) -> float:
        """Plain tokens/s of an engine of this model alone (for c, and to check plain decoding)."""
        saved, args.model = args.model, model
        llm = make_llm(args, None)
        args.model = saved
        run_one(llm.llm_engine, prompts[0], warmup, "warmup")
        rate = _decode_rate(llm, prompts, params)[0]
        del llm
        gc.collect()
        return rate

    # Every policy runs on one engine, switched between runs (plain = no drafting at all).
    k_max = max(args.k)
    # With --adaptive the engine is built adaptive, so it calibrates at load as any would.
    llm = make_llm(args, {**spec, "num_speculative_tokens": k_max, "adaptive": args.adaptive})
    drafting = llm.llm_engine.drafting
    run_one(llm.llm_engine, prompts[0], warmup, "warmup")
    variants = [(k, "") for k in args.k] + ([(k_max, "fresh"), (k_max, "warm")]
                                            if args.adaptive else [])
    warm: list[Any] = []  # the "warm" controller, kept from one round to the next

    def policy(k: int, controller: str = "") -> tuple[float, list[float], float]:
        drafting.set_policy(k, bool(controller))
        if controller == "warm":
            if warm:
                drafting.adaptive = warm[0]
            warm[:] = [drafting.adaptive]
        rate, per_pos, length = _decode_rate(llm, prompts, params)
        return rate, per_pos[:k], length

    rounds: list[list[tuple[float, list[float], float]]] = []
    plain: list[float] = []  # per round: no drafting, the mean of its runs before and after
    target_alone: list[float] = []
    draft_alone: list[float] = []
    for _ in range(args.rounds):
        before = policy(0)[0]
        rounds.append([policy(k, a) for k, a in variants])
        plain.append((before + policy(0)[0]) / 2)
        target_alone.append(alone(args.model))
        if not model_free:  # a lookup's cost is no model's: c = 0
            draft_alone.append(alone(spec["model"]))
    target_rate = statistics.median(plain)
    c = (statistics.median(t / d for t, d in zip(target_alone, draft_alone))
         if draft_alone else 0.0)
    runs = []
    for i, (k, adaptive) in enumerate(variants):
        ratios = [r[i][0] / p for p, r in zip(plain, rounds)]
        tok_s, per_pos, length = statistics.median(r[i][0] for r in rounds), *rounds[0][i][1:]
        predicted = (1 + sum(per_pos)) / (k * c + 1)
        runs.append({"k": k, "adaptive": bool(adaptive), "controller": adaptive or None,
                     "tokens_per_s": tok_s,
                     "acceptance_by_position": per_pos, "mean_acceptance_length": length,
                     "speedup_measured": statistics.median(ratios),
                     "speedup_by_round": ratios,
                     "speedup_predicted": None if adaptive else predicted})
        print(f"k={k}{f' adaptive ({adaptive})' if adaptive else ''}: {tok_s:.1f} tok/s, "
              f"acceptance length "
              f"{length:.2f}, speedup {statistics.median(ratios):.2f}x measured"
              + (f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)})" if len(ratios) > 1 else "")
              + ("" if adaptive else f", {predicted:.2f}x predicted"))
    print(f"plain decoding: {target_rate:.1f} tok/s on the speculative engine with drafting off, "
          f"{statistics.median(target_alone):.1f} tok/s on an engine of the target alone")
    print(memory_line())
    drafter = spec["model"] if not model_free else infer_method(spec)
    result = {"benchmark": "spec", "model": args.model, "draft": drafter,
              "speculative_config": spec, "num_prompts": len(prompts),
              "max_tokens": args.max_tokens, "temperature": args.temperature,
              "rounds": args.rounds, "target_tokens_per_s": target_rate,
              "target_alone_tokens_per_s": statistics.median(target_alone),
              "draft_tokens_per_s": statistics.median(draft_alone) if draft_alone else None,
              "cost_ratio_c": c,
              "runs": runs}
    if args.plot:
        _plot(result, args.plot)
        result["plot"] = args.plot
    write_json(args.output_json, result)
    return result


def _plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fixed = [r for r in result["runs"] if not r["adaptive"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in fixed:
        left.plot(range(1, r["k"] + 1), r["acceptance_by_position"], marker="o",
                  label=f"k={r['k']}")
    left.set(xlabel="draft position", ylabel="P(accepted)", ylim=(0, 1.05),
             title="acceptance by position",
             xticks=range(1, max((r["k"] for r in fixed), default=1) + 1))
    left.legend()
    ks = [r["k"] for r in fixed]
    right.plot(ks, [r["speedup_measured"] for r in fixed], marker="o", label="measured")
    right.plot(ks, [r["speedup_predicted"] for r in fixed], marker="s", ls="--",
               label="predicted E(k) / (k c + 1)")
    for r in result["runs"]:
        if r["adaptive"]:
            right.axhline(r["speedup_measured"], ls=":", label=f"adaptive ({r['controller']})",
                          color="green" if r["controller"] == "fresh" else "purple")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xlabel="k (draft tokens per step)", ylabel="speedup over plain decoding", xticks=ks,
              title=f"c = {result['cost_ratio_c']:.2f}")
    right.legend()
    fig.suptitle(f"{result['model']} drafted by {result['draft']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("spec", help="acceptance by position, cost ratio, measured vs predicted "
                                    "speedup over a range of k")
    p.add_argument("--model", required=True, help="the target model")
    p.add_argument("--speculative-config", "-sc", required=True,
                   help="JSON with the draft 'model', or a model-free 'method' (ngram, "
                        "suffix), and any other keys; k is varied")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--adaptive", action="store_true", help="also run adaptive speculation")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure every configuration this many times, interleaved; speedups "
                        "are medians of per-round ratios to plain (for shared, noisy machines)")
    p.add_argument("--plot", default=None, help="PNG file for the plot")
    p.add_argument("--dtype", default="auto")
    add_weight_args(p)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    add_prompt_args(p)
    p.set_defaults(func=main)
