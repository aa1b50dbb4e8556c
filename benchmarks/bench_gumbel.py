"""Acceptance of the rejection methods on the real pairs: "standard" (Leviathan et al.) against
"gumbel" (drafter-invariant Gumbel-max coupling), each with greedy and probabilistic drafting, at
temperatures 0.7 and 1.0 (no top-k/top-p).

Pairs: SmolLM2-135M drafting for itself; the synthetic pair (SmolLM2 plus `--extra` perturbing
layers as the target, drafted by SmolLM2: a synthetic pair, see synthetic_pair.py); Gemma 3 270M
drafted by SmolLM2 through TLI. Acceptance is counted, not timed: one engine per pair, its
verifier, plain sampler and draft sampling switched between runs (the same objects a fresh engine
with that speculative_config builds), seeded requests, the engine's spec-decode counters.
`.venv/bin/python benchmarks/bench_gumbel.py [--prompts 8] [--tokens 32] [--k 3] [--pairs ...]`
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import SMOLLM2, prompts, save  # noqa: E402
from synthetic_pair import build_target  # noqa: E402

GEMMA3 = "google/gemma-3-270m"


def set_method(llm, method: str, drafting: str) -> None:
    """What SpeculativeConfig(rejection_sample_method=method, draft_sample_method=drafting)
    gives a fresh engine (llm_engine._samplers, spec_decode/factory.py)."""
    from tandem.sample.gumbel_verifier import GumbelRejectionSampler
    from tandem.sample.rejection_sampler import RejectionSampler
    from tandem.sample.sampler import Sampler

    engine = llm.llm_engine
    gumbel = method == "gumbel"
    engine.runner.rejection_sampler = GumbelRejectionSampler() if gumbel else RejectionSampler()
    engine.runner.sampler = Sampler(method)
    inputs = engine.proposer.inputs
    inputs.method, inputs.probabilistic = method, drafting == "probabilistic"


def counters(llm) -> tuple[float, float, float]:
    m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
    return (m["tandem:spec_decode_num_drafts"], m["tandem:spec_decode_num_draft_tokens"],
            m["tandem:spec_decode_num_accepted_tokens"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--extra", type=int, default=60)
    ap.add_argument("--eps", type=float, default=0.02)
    ap.add_argument("--pairs", default="self,synthetic,tli")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tandem-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tandem import LLM, SamplingParams

    texts = prompts(args.prompts)
    common = dict(dtype="float32", max_model_len=2048, disable_log_stats=True)
    pairs = {"self": (SMOLLM2, SMOLLM2, False), "tli": (GEMMA3, SMOLLM2, True)}
    if "synthetic" in args.pairs:
        pairs["synthetic"] = (str(build_target(
            Path(args.workdir) / f"target-{args.extra}-{args.eps}", args.extra, args.eps)),
            SMOLLM2, False)
    rows = []
    for name in args.pairs.split(","):
        target, draft, tli = pairs[name]
        llm = LLM(target, **common, speculative_config={
            "model": draft, "num_speculative_tokens": args.k, "adaptive": False,
            "use_heterogeneous_vocab": tli})
        for t in (0.7, 1.0):
            for method in ("standard", "gumbel"):
                for drafting in ("greedy", "probabilistic"):
                    set_method(llm, method, drafting)
                    before = counters(llm)
                    llm.generate(texts, [SamplingParams(temperature=t, seed=i,
                                                        max_tokens=args.tokens, ignore_eos=True)
                                         for i in range(len(texts))], use_tqdm=False)
                    steps, drafted, accepted = (a - b for a, b in zip(counters(llm), before))
                    row = {"pair": name, "temperature": t, "method": method,
                           "draft_sample_method": drafting, "acceptance_rate": accepted / drafted,
                           "mean_acceptance_length": 1 + accepted / steps,
                           "drafted": drafted}
                    rows.append(row)
                    print(f"{name:9s} T={t} {method:8s} {drafting:13s} acceptance "
                          f"{row['acceptance_rate']:.3f}  mean length "
                          f"{row['mean_acceptance_length']:.2f}  ({drafted:.0f} drafts)",
                          flush=True)
        del llm
        gc.collect()
    result = {"k": args.k, "prompts": args.prompts, "tokens_per_prompt": args.tokens,
              "synthetic_pair": f"SmolLM2-135M + {args.extra} perturbing layers (eps {args.eps})",
              "rows": rows}
    print(f"saved {save('gumbel_acceptance', result)}")


if __name__ == "__main__":
    main()
