"""What batch invariance costs (issue 44): today's kernels, which give a row the same bits at every
batch size, against the kernels the batch's shape used to choose, on one engine, policies
alternating within each round.

"shape-chosen" is the policy before issue 44, rebuilt here by patching the engine (never in
tandem itself): float32 linear layers above 64 rows on the faster of oneDNN and BLAS (timed per
shape and row bucket, the weight evicted first, as the old start-up timing did), requests with
more than 16 queries (prefill chunks, long verifications) on SDPA's padded groups, and the fused
decoder stacks only for steps of at most 64 rows whose requests all have at most 16 queries.

Measured: prefill (one prompt of each length, one token out), one stream's decode, and N streams
of `--input-len` + `--output-len` tokens (end to end, and the generation rate once every prompt
is prefilled, as `tandem bench throughput` reports it). Prints medians of per-round ratios
(invariant / shape-chosen; above 1: the rule is faster) and writes
benchmarks/results/invariance-<weights>.json.

  .venv/bin/python benchmarks/bench_invariance.py [-q gguf|none] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from common import SMOLLM2, prompts, save  # noqa: E402


@contextlib.contextmanager
def shape_chosen() -> Iterator[None]:
    """The engine as it chose kernels by the batch's shape before issue 44."""
    from tandem.attention import sdpa_backend
    from tandem.attention.metadata import SMALL_QUERY
    from tandem.kernels import cpu as cpu_kernels
    from tandem.layers import linear as linear_mod
    from tandem.layers import matmul_choice as mc
    from tandem.models import llama_fused
    real_kernel_for, real_attention = mc.kernel_for, sdpa_backend.paged_attention
    real_step_group = llama_fused.step_group
    chosen: dict[tuple, Callable] = {}

    def kernel_for(x: torch.Tensor, w: torch.Tensor, b: Any) -> Callable:
        if x.shape[0] <= 64:
            return real_kernel_for(x, w, b)
        key = (w.shape[0], w.shape[1], mc._bucket(x.shape[0]))
        if key not in chosen:
            probe = torch.randn(key[2], w.shape[1])
            chosen[key] = min(mc.KERNELS.values(), key=lambda k: mc._time(k, probe, w, b))
        return chosen[key]

    def attention(q, k_cache, v_cache, meta, scale, window, softcap=None):
        lens = meta.query_lens
        if meta.requests is None or max(lens) <= SMALL_QUERY or softcap is not None:
            return real_attention(q, k_cache, v_cache, meta, scale, window, softcap)
        out = q.new_empty(q.shape)
        starts = meta.requests[:, 0].contiguous()
        for g in meta.groups:  # small groups on the kernel, prefill chunks on SDPA
            first = int(torch.searchsorted(starts, torch.tensor(g.start)))
            members = slice(first, first + g.q_pos.shape[0])
            if g.small and cpu_kernels.paged_attention(
                    q, k_cache, v_cache, out, meta.requests[members].contiguous(),
                    meta.kv_slots[members, :g.kv_slots.shape[1]].contiguous(), scale, window):
                continue
            og = sdpa_backend._attend(q, k_cache, v_cache, g, scale, window)
            if g.uniform:
                out.narrow(0, g.start, g.num_queries).copy_(og)
            else:
                out.index_copy_(0, g.out_index, og.index_select(0, g.valid_rows))
        return out

    def step_group(x: torch.Tensor):
        meta = real_step_group(x)
        if meta is None or x.shape[0] > 64 or max(meta.query_lens) > SMALL_QUERY:
            return None
        return meta

    import tandem.layers.attention as attention_layer
    patches = [(mc, "kernel_for", kernel_for), (linear_mod, "kernel_for", kernel_for),
               (sdpa_backend, "paged_attention", attention),
               (attention_layer, "paged_attention", attention),
               (llama_fused, "step_group", step_group)]
    saved = [(m, n, getattr(m, n)) for m, n, _ in patches]
    for m, n, v in patches:
        setattr(m, n, v)
    try:
        yield
    finally:
        for m, n, v in saved:
            setattr(m, n, v)


def prefill(llm: Any, ids: list[int]) -> float:
    """Prompt tokens per second of one prompt, one token out."""
    from tandem import SamplingParams
    from tandem.bench.throughput import run_batch
    params = SamplingParams(temperature=0, max_tokens=1)
    return len(ids) / run_batch(llm.llm_engine, [ids], params, f"p{time.monotonic_ns()}")[
        "seconds"]


def streams(llm: Any, texts: list[list[int]], output_len: int) -> dict[str, float]:
    from tandem import SamplingParams
    from tandem.bench.throughput import run_batch
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    out = run_batch(llm.llm_engine, texts, params, f"s{time.monotonic_ns()}")
    return {"end_to_end": out["output_tokens_per_s"],
            "generation": out["generation_tokens_per_s"] or 0.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-q", "--quantization", default="gguf", choices=["gguf", "none"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-lens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    from tandem import LLM
    from tandem.bench.common import cpu_name
    from tandem.bench.throughput import fixed_length
    llm = LLM(SMOLLM2, quantization=args.quantization, max_model_len=4096, seed=0,
              enable_prefix_caching=False, max_num_seqs=max(args.streams),
              max_num_batched_tokens=max(args.prefill_lens + [2048]))
    tok = llm.llm_engine.tokenizer
    texts = prompts(max(args.streams))
    long_ids = fixed_length(tok, [" ".join(texts)], max(args.prefill_lens))[0]
    cases: dict[str, Callable[[], dict[str, float]]] = {}
    for n in args.prefill_lens:
        cases[f"prefill {n}"] = lambda n=n: {"prompt_tok_s": prefill(llm, long_ids[:n])}
    for s in args.streams:
        ids = fixed_length(tok, texts[:s], args.input_len)
        cases[f"{s} streams"] = lambda ids=ids: streams(llm, ids, args.output_len)
    policies = {"invariant": contextlib.nullcontext, "shape-chosen": shape_chosen}
    for name, case in cases.items():  # warm-up: oneDNN primitives, the timed kernel choice
        for policy in policies.values():
            with policy():
                case()
    results: dict[str, Any] = {"cpu": cpu_name(), "threads": torch.get_num_threads(),
                               "quantization": args.quantization, "cases": {}}
    for name, case in cases.items():
        rounds = []
        for r in range(args.rounds):
            order = list(policies) if r % 2 == 0 else list(policies)[::-1]
            got = {}
            for p in order:
                with policies[p]():
                    got[p] = case()
            rounds.append(got)
        metrics = rounds[0]["invariant"].keys()
        summary = {m: {"invariant": statistics.median(r["invariant"][m] for r in rounds),
                       "shape-chosen": statistics.median(r["shape-chosen"][m] for r in rounds),
                       "ratio": statistics.median(r["invariant"][m] / r["shape-chosen"][m]
                                                  for r in rounds if r["shape-chosen"][m]),
                       "round_ratios": [r["invariant"][m] / r["shape-chosen"][m]
                                        for r in rounds if r["shape-chosen"][m]]}
                   for m in metrics}
        results["cases"][name] = summary
        for m, v in summary.items():
            print(f"{name:>14} {m:>13}: invariant {v['invariant']:9.1f}  shape-chosen "
                  f"{v['shape-chosen']:9.1f}  ratio {v['ratio']:.3f} (rounds "
                  f"{', '.join(f'{x:.3f}' for x in v['round_ratios'])})", flush=True)
    print(f"saved {save(f'invariance-{args.quantization}', results)} ({results['cpu']}, "
          f"{results['threads']} threads)")


if __name__ == "__main__":
    main()
