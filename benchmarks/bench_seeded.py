"""What a seed costs: one stream of sampled decoding with and without `SamplingParams.seed`, on one
engine, alternating within each round. A seeded request draws by Gumbel-max (sample/gumbel.py:
its tokens never depend on drafting), an unseeded one by the keyed inverse CDF.

Default: Gemma 3 270M (a 262,144-token vocabulary, where the draw is the largest share of a
step), no draft, T = 0.8, top-p 0.95, 128 tokens per request. Prints tokens/s of both and the
median of per-round ratios (seeded / unseeded), and writes benchmarks/results/seeded.json.

  .venv/bin/python benchmarks/bench_seeded.py [--model google/gemma-3-270m] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from common import prompts, save  # noqa: E402


def decode(llm, seed: int | None, tokens: int, top_p: float, temperature: float) -> float:
    """Output tokens per second of one request (its prefill timed apart and left out)."""
    from tandem import SamplingParams
    engine = llm.llm_engine
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed, max_tokens=tokens,
                            ignore_eos=True)
    engine.add_request(f"r{time.monotonic_ns()}", prompts(1)[0], params)
    engine.step()  # the prefill and the first token
    t0, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="google/gemma-3-270m")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()
    from tandem import LLM
    from tandem.bench.common import cpu_name
    llm = LLM(args.model, seed=0, enable_prefix_caching=False)
    kinds = {"seeded": 1234, "unseeded": None}
    for seed in kinds.values():  # warm-up
        decode(llm, seed, 16, args.top_p, args.temperature)
    rounds = []
    for r in range(args.rounds):
        order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]
        rounds.append({k: decode(llm, kinds[k], args.tokens, args.top_p, args.temperature)
                       for k in order})
    ratios = [x["seeded"] / x["unseeded"] for x in rounds]
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "model": args.model,
              "temperature": args.temperature, "top_p": args.top_p, "tokens": args.tokens,
              "seeded_tok_s": statistics.median(x["seeded"] for x in rounds),
              "unseeded_tok_s": statistics.median(x["unseeded"] for x in rounds),
              "ratio": statistics.median(ratios), "round_ratios": ratios}
    print(f"seeded {result['seeded_tok_s']:.1f} tok/s, unseeded {result['unseeded_tok_s']:.1f} "
          f"tok/s: {result['ratio']:.3f}x (rounds {', '.join(f'{x:.3f}' for x in ratios)}); "
          f"{result['cpu']}, {result['threads']} threads")
    print(f"saved {save('seeded', result)}")


if __name__ == "__main__":
    main()
