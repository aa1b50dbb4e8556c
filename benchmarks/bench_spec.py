"""Speculative vs plain decoding, measured vs predicted, in one run.

Pair: the synthetic target of `synthetic_pair.py` (SmolLM2 plus extra perturbing layers) with
SmolLM2 as its draft. Measures, single stream, greedy:
  alpha  acceptance rate (accepted / drafted, from the engine's counters)
  c      draft/target cost ratio (plain decode time per token of each model)
  speedup measured = speculative tok/s / plain target tok/s
  speedup predicted = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))   (Leviathan et al.)
and checks that speculative output equals plain output token for token.
`.venv/bin/python benchmarks/bench_spec.py [--k 3] [--extra 90] [--eps 0.02]`
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import SMOLLM2, prompts, save, timed  # noqa: E402
from synthetic_pair import build_target  # noqa: E402


def decode_rate(llm, texts, sp) -> tuple[float, list[list[int]]]:
    llm.generate(texts[:1], type(sp)(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    total = 0.0
    out_tokens = []
    for text in texts:  # single stream: one prompt at a time
        t, outs = timed(lambda: llm.generate([text], sp, use_tqdm=False))
        total += t
        out_tokens.append(outs[0].outputs[0].token_ids)
    return sum(len(t) for t in out_tokens) / total, out_tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--extra", type=int, default=90, help="perturbing layers added to the target")
    ap.add_argument("--eps", type=float, default=0.02, help="scale of their output projections")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tandem-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tandem import LLM, SamplingParams

    target = str(build_target(Path(args.workdir) / f"target-{args.extra}-{args.eps}",
                              args.extra, args.eps))
    texts = prompts(args.prompts)
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    common = dict(dtype="float32", enable_prefix_caching=False, max_model_len=2048)

    draft_llm = LLM(SMOLLM2, **common)
    draft_rate, _ = decode_rate(draft_llm, texts, sp)
    del draft_llm
    plain = LLM(target, **common)
    plain_rate, plain_out = decode_rate(plain, texts, sp)
    del plain
    spec = LLM(target, **common, speculative_config={"model": SMOLLM2,
                                                     "num_speculative_tokens": args.k,
                                                     "adaptive": False})
    spec_rate, spec_out = decode_rate(spec, texts, sp)
    m = {x.name: x for x in spec.get_metrics()}
    drafted = m["tandem:spec_decode_num_draft_tokens"].value
    accepted = m["tandem:spec_decode_num_accepted_tokens"].value
    steps = m["tandem:spec_decode_num_drafts"].value

    alpha = accepted / drafted
    c = plain_rate / draft_rate  # time per token of the draft over that of the target
    k = args.k
    predicted = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    measured = spec_rate / plain_rate
    result = {
        "pair": f"synthetic: SmolLM2-135M + {args.extra} perturbing layers (eps {args.eps}) as "
                "target, SmolLM2-135M as draft",
        "k": k, "tokens_per_prompt": args.tokens, "prompts": args.prompts,
        "acceptance_rate": alpha, "mean_acceptance_length": 1 + accepted / steps,
        "cost_ratio": c, "plain_tok_s": plain_rate, "spec_tok_s": spec_rate,
        "draft_tok_s": draft_rate, "measured_speedup": measured, "predicted_speedup": predicted,
        "measured_over_predicted": measured / predicted,
        "greedy_output_identical": spec_out == plain_out,
    }
    print(f"pair: {result['pair']}")
    print(f"k={k}  acceptance rate alpha={alpha:.3f}  mean acceptance length "
          f"{result['mean_acceptance_length']:.2f}  draft/target cost ratio c={c:.3f}")
    print(f"plain target {plain_rate:.1f} tok/s, speculative {spec_rate:.1f} tok/s, "
          f"draft alone {draft_rate:.1f} tok/s")
    print(f"speedup measured {measured:.2f}x, predicted {predicted:.2f}x, "
          f"measured/predicted {measured / predicted:.2f}")
    print(f"speculative greedy output identical to plain: {result['greedy_output_identical']}")
    print(f"saved {save('spec', result)}")


if __name__ == "__main__":
    main()
