"""What a k policy for n-gram drafting can buy, replayed without timing noise: greedy outputs of
the repetitive prompts (benchmarks/workloads/), the engine's own n-gram lookup over each
request's tokens, and the verify costs its load-time calibration measured on this CPU.

For each policy the replay steps through every output as speculative decoding would (propose up
to k, accept the longest prefix equal to the greedy output, emit it and one token more) and
prices a step with n verified tokens at the calibration's cost of n tokens; the figure is the
output's tokens at one plain step's cost over the replayed time (the speed-up if nothing but
the target's forward cost anything). Policies: one k for every step (1..16); k0 after a miss and
k1 after a proposal accepted whole (what `AdaptiveK.choose_lookup` chooses between); and the
oracle, which verifies exactly the accepted run (a bound no policy reaches).

    python benchmarks/lookup_policy_replay.py [--model smollm2] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model_free import model_path, repetitive_prompts  # noqa: E402
from benchmarks.common import save  # noqa: E402
from tandem.bench.common import cpu_name  # noqa: E402
from tandem.spec_decode.ngram import NgramIndex  # noqa: E402

Policy = Callable[[bool], int]  # whether the last proposal was accepted whole -> k


def replay(rows: list[tuple[list[int], list[int]]], cost: Callable[[int], float],
           policy: Policy, oracle: bool = False, k_cap: int = 64) -> float:
    """The speed-up of `policy` replayed over `rows` (prompt, greedy output); with `oracle`,
    each step verifies only the drafts that will be accepted (policy then asks for k_cap)."""
    tokens = seconds = 0.0
    for prompt, out in rows:
        ctx, index, i, streak = list(prompt), NgramIndex(2, 5), 0, False
        while i < len(out):
            draft = index.propose(ctx, k_cap)[:policy(streak)]
            a = 0
            while a < len(draft) and i + a < len(out) and draft[a] == out[i + a]:
                a += 1
            seconds += cost(1 + (a if oracle else len(draft)))
            emitted = min(a + 1, len(out) - i)
            ctx.extend(out[i:i + emitted])
            i += emitted
            tokens += emitted
            streak = bool(draft) and a == len(draft)
    return tokens * cost(1) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("tandem").setLevel(logging.WARNING)
    from tandem import LLM, SamplingParams
    llm = LLM(model_path(args.model, args), max_model_len=4096, enable_prefix_caching=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 16,
                                  "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    llm.llm_engine.drafting.set_policy(0)  # plain decoding: the outputs are greedy's
    outs = llm.generate(repetitive_prompts(args.model),
                        SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                       ignore_eos=True), use_tqdm=False)
    rows = [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]
    curve = llm.llm_engine.drafting.calibration.target
    measured = {n: curve(n) for n in sorted(curve.sizes)}
    top = max(measured)

    def cost(n: int) -> float:  # past the calibration's sizes: its last step per token
        return measured[n] if n in measured else \
            measured[top] + (measured[top] - measured[top - 1]) * (n - top)

    print(f"CPU: {cpu_name()}; {args.model}, {len(rows)} prompts x {args.max_tokens} tokens; "
          "verify ms by tokens: " + "/".join(f"{1e3 * measured[n]:.1f}" for n in measured))
    results: dict[str, float] = {"oracle": replay(rows, cost, lambda streak: 64, oracle=True)}
    for k in (1, 2, 3, 4, 5, 6, 8, 12, 16):
        results[f"k={k}"] = replay(rows, cost, lambda streak, k=k: k)
    for k0 in (0, 1, 2, 3):
        for k1 in (4, 6, 8, 12, 16):
            results[f"k0={k0} k1={k1}"] = replay(
                rows, cost, lambda streak, k0=k0, k1=k1: k1 if streak else k0)
    for name, x in results.items():
        print(f"{name:16s} {x:.3f}x")
    single = max(v for n, v in results.items() if n.startswith("k="))
    pair = max(v for n, v in results.items() if n.startswith("k0="))
    print(f"best one k {single:.3f}x, best pair {pair:.3f}x ({pair / single:.3f}x), "
          f"oracle {results['oracle']:.3f}x")
    saved = save("lookup_policy_replay", {"cpu": cpu_name(), "model": args.model,
                                          "costs": measured, "results": results})
    print(f"written to {saved}")


if __name__ == "__main__":
    main()
