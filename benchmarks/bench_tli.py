"""Token-Level Intersection on the real pair, in one run: Gemma 3 270M drafted by SmolLM2-135M.

For each temperature (greedy and 0.8 with top_p 0.95), each k, each draft sample method and each
feedback mapping ("reencode": target tokens without a twin are re-encoded into draft tokens; "unk":
they become the draft's unknown token), on the shared prompt set:
  acceptance rate, mean acceptance length, tokens/s, and the speedup over plain Gemma decoding
  measured in the same run, beside the speedup predicted from alpha and the cost ratio c
  (Leviathan et al.: (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))).
Greedy runs also check that the output equals plain Gemma's token for token.
`--concurrency 1` runs one prompt at a time (latency); the default submits every prompt at once
(throughput under continuous batching).
`.venv/bin/python benchmarks/bench_tli.py [--prompts 48] [--tokens 48] [--concurrency 0]`
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import subprocess

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import SMOLLM2, prompts, save, timed  # noqa: E402

GEMMA3 = "google/gemma-3-270m"


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def run(llm, texts: list[str], sp_for, concurrency: int) -> tuple[float, list[list[int]]]:
    """tokens/s over all prompts, and the generated ids (prompt order)."""
    from tandem import SamplingParams

    llm.generate(texts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    step = concurrency or len(texts)
    total, outs = 0.0, []
    for i in range(0, len(texts), step):
        chunk = texts[i:i + step]
        t, res = timed(lambda: llm.generate(chunk, [sp_for(i + j) for j in range(len(chunk))],
                                            use_tqdm=False))
        total += t
        outs += [o.outputs[0].token_ids for o in res]
    return sum(len(o) for o in outs) / total, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=0, help="0: all prompts at once")
    ap.add_argument("--ks", default="3,5")
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--methods", default="greedy,probabilistic")
    ap.add_argument("--feedbacks", default="reencode,unk")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tandem import LLM, SamplingParams

    texts = prompts(args.prompts)
    common = dict(dtype="float32", max_model_len=2048, disable_log_stats=True)

    def params(temperature: float):
        if temperature == 0:
            return lambda i: SamplingParams(temperature=0, max_tokens=args.tokens,
                                            ignore_eos=True)
        return lambda i: SamplingParams(temperature=temperature, top_p=0.95, seed=i,
                                        max_tokens=args.tokens, ignore_eos=True)

    temps = [float(t) for t in args.temperatures.split(",")]
    rates: dict[str, dict[float, float]] = {"gemma": {}, "smollm2": {}}
    plain_out: dict[float, list[list[int]]] = {}
    for name, model in (("gemma", GEMMA3), ("smollm2", SMOLLM2)):
        llm = LLM(model, **common)
        for t in temps:
            rates[name][t], out = run(llm, texts, params(t), args.concurrency)
            if name == "gemma":
                plain_out[t] = out
        del llm
        gc.collect()

    rows = []
    for t in temps:
        c = rates["gemma"][t] / rates["smollm2"][t]  # draft time per token / target's
        for k in [int(k) for k in args.ks.split(",")]:
            for method in args.methods.split(","):
                for feedback in args.feedbacks.split(","):
                    llm = LLM(GEMMA3, **common, speculative_config={
                        "model": SMOLLM2, "num_speculative_tokens": k, "adaptive": False,
                        "method": "draft_model",
                        "use_heterogeneous_vocab": True, "draft_sample_method": method,
                        "heterogeneous_vocab_feedback": feedback,
                        # the requests are seeded: "auto" (the default) would verify them all
                        # by the gumbel rule; these rows measure Leviathan's
                        "rejection_sample_method": "standard"})
                    rate, out = run(llm, texts, params(t), args.concurrency)
                    m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
                    del llm
                    gc.collect()
                    drafted = m["tandem:spec_decode_num_draft_tokens"]
                    accepted = m["tandem:spec_decode_num_accepted_tokens"]
                    alpha = accepted / drafted
                    predicted = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
                    row = {"temperature": t, "k": k, "draft_sample_method": method,
                           "feedback": feedback, "acceptance_rate": alpha,
                           "mean_acceptance_length": 1 + accepted / m["tandem:spec_decode_num_drafts"],
                           "tok_s": rate, "plain_tok_s": rates["gemma"][t],
                           "speedup": rate / rates["gemma"][t], "cost_ratio": c,
                           "predicted_speedup": predicted,
                           "greedy_output_identical": (out == plain_out[t]) if t == 0 else None}
                    rows.append(row)
                    same = "" if t else f"  identical to plain: {row['greedy_output_identical']}"
                    print(f"T={t} k={k} {method:13s} {feedback:8s} alpha={alpha:.3f} "
                          f"mean len {row['mean_acceptance_length']:.2f}  {rate:6.1f} tok/s vs "
                          f"plain {rates['gemma'][t]:6.1f}: {row['speedup']:.2f}x (predicted "
                          f"{predicted:.2f}x, c={c:.2f}){same}", flush=True)
    result = {"cpu": cpu_name(), "pair": "Gemma 3 270M (target) + SmolLM2-135M-Instruct (draft)",
              "prompts": args.prompts, "tokens_per_prompt": args.tokens,
              "concurrency": args.concurrency or args.prompts,
              "plain_tok_s": {name: {str(t): r for t, r in v.items()} for name, v in rates.items()},
              "rows": rows}
    print(f"CPU: {result['cpu']}")
    suffix = f"c{args.concurrency}" if args.concurrency else "batch"
    print(f"saved {save(f'tli_{suffix}', result)}")


if __name__ == "__main__":
    main()
