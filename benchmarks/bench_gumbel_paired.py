"""Per-position acceptance of each rejection method on the SAME contexts (paired, low variance).

While a pair decodes with probabilistic drafting, every verified draft position yields the target's
distribution p and the draft's q (both processed at the request's temperature; a TLI draft's q
placed in target ids) on one and the same context. From them:
  standard, probabilistic draft: 1 - TV(p, q) = sum min(p, q)   (exact)
  greedy draft (either method):  p(argmax q)                     (exact)
  gumbel, probabilistic draft:   P(argmax(log p + g) = argmax(log q + g)), over `--draws` noise
                                 vectors g per position
The engine-run counts of bench_gumbel.py compare methods on different trajectories; these compare
them position by position. Pairs and temperatures as in bench_gumbel.py.
`.venv/bin/python benchmarks/bench_gumbel_paired.py [--prompts 8] [--tokens 48] [--pairs ...]`
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_gumbel import GEMMA3  # noqa: E402
from common import SMOLLM2, prompts, save  # noqa: E402
from synthetic_pair import build_target  # noqa: E402


def position_stats(p: torch.Tensor, q: torch.Tensor, draws: int,
                   gen: torch.Generator) -> tuple[float, float, float]:
    """(standard, greedy, gumbel) acceptance of one position; p, q: [V] probabilities."""
    standard = float(torch.minimum(p, q).sum())
    greedy = float(p[q.argmax()])
    live = ((p > 1e-12) | (q > 1e-12)).nonzero().flatten()   # others can never win
    lp, lq = torch.log(p[live].double()), torch.log(q[live].double())
    u = torch.rand(draws, len(live), generator=gen, dtype=torch.float64).clamp_min(1e-300)
    g = -torch.log(-torch.log(u))                                  # [draws, L]
    gumbel = float(((lp + g).argmax(-1) == (lq + g).argmax(-1)).double().mean())
    return standard, greedy, gumbel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--draws", type=int, default=64)
    ap.add_argument("--extra", type=int, default=60)
    ap.add_argument("--eps", type=float, default=0.02)
    ap.add_argument("--pairs", default="self,synthetic,tli")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tandem-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tandem import LLM, SamplingParams
    from tandem.sample.logits_processing import apply_penalties, compute_probs

    texts = prompts(args.prompts)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in args.pairs.split(","):
        if name == "synthetic":
            target = str(build_target(Path(args.workdir) / f"target-{args.extra}-{args.eps}",
                                      args.extra, args.eps))
        else:
            target = GEMMA3 if name == "tli" else SMOLLM2
        llm = LLM(target, dtype="float32", max_model_len=2048, disable_log_stats=True,
                  speculative_config={"model": SMOLLM2,
                                      "num_speculative_tokens": args.k, "adaptive": False,
                                      "use_heterogeneous_vocab": name == "tli",
                                      "rejection_sample_method": "standard",
                                      "draft_sample_method": "probabilistic"})
        engine = llm.llm_engine
        inputs, verifier = engine.proposer.inputs, engine.runner.rejection_sampler
        q_rows: dict[tuple[int, int], torch.Tensor] = {}
        found: list[tuple[float, float, float]] = []

        def spy_propose(logits, md, masks=None, _orig=inputs.propose):
            out = _orig(logits, md, masks)
            for i, (r, pos) in enumerate(zip(md.rngs, md.positions)):
                q_rows[(id(r), pos)] = out[2][i].clone()  # the draft being verified next
            return out

        def spy_verify(target_logits, counts, drafts, draft_probs, md, _orig=verifier.__call__):
            rows_md = md.expand([k + 1 for k in counts],
                                [[list(d[:j]) for j in range(k + 1)] for d, k in zip(drafts, counts)])
            logits = target_logits.float()
            if not md.no_penalties:
                logits = apply_penalties(logits, rows_md)
            p = compute_probs(logits, rows_md, apply_penalty=False)
            row = 0
            for i, k in enumerate(counts):
                for j in range(k):  # draft rows only: the bonus row has no q
                    q = q_rows.get((id(md.rngs[i]), md.positions[i] + j))
                    if q is not None:
                        found.append(position_stats(p[row + j], q, args.draws, gen))
                row += k + 1
            return _orig(target_logits, counts, drafts, draft_probs, md)

        inputs.propose = spy_propose
        engine.runner.rejection_sampler = type("Spy", (), {"__call__": staticmethod(spy_verify)})()
        for t in (0.7, 1.0):
            found.clear()
            llm.generate(texts, [SamplingParams(temperature=t, seed=i, max_tokens=args.tokens,
                                                ignore_eos=True) for i in range(len(texts))],
                         use_tqdm=False)
            n = len(found)
            std, greedy, gum = (sum(f[c] for f in found) / n for c in range(3))
            row = {"pair": name, "temperature": t, "positions": n, "standard_probabilistic": std,
                   "greedy_draft": greedy, "gumbel_probabilistic": gum,
                   "gumbel_over_standard": gum / std}
            rows.append(row)
            print(f"{name:9s} T={t}: {n} positions  standard {std:.3f}  greedy draft {greedy:.3f}"
                  f"  gumbel {gum:.3f}  (gumbel/standard {gum / std:.3f})", flush=True)
        del llm, engine, inputs, verifier
        gc.collect()
    result = {"k": args.k, "prompts": args.prompts, "tokens_per_prompt": args.tokens,
              "draws_per_position": args.draws,
              "synthetic_pair": f"SmolLM2-135M + {args.extra} perturbing layers (eps {args.eps})",
              "rows": rows}
    print(f"saved {save('gumbel_paired_acceptance', result)}")


if __name__ == "__main__":
    main()
