"""KV cache formats (`kv_cache_dtype`): decoding speed at depth, and accuracy against a float32
cache, on one model.

  speed:    one stream decoding 64 tokens after a prompt of each depth, every format on an
            engine of its own, formats alternating within each of --rounds rounds; tokens/s
            (the generation rate) and the ratio to the first format.
  accuracy: one document of ~1,000 tokens (the shared prompts joined), teacher-forced: each
            format's top-1 token at every position against the first format's, and the mean
            absolute change of the next token's logprob. Use float weights (`-q none`): a GGUF
            file's quantized activations move a few % of top-1 tokens on any perturbation.

  .venv/bin/python benchmarks/bench_kv_cache.py speed [--depths 64 1024 4096] [-q gguf]
  .venv/bin/python benchmarks/bench_kv_cache.py accuracy -q none [--model google/gemma-3-270m]
Writes benchmarks/results/kv-cache-<mode>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from common import SMOLLM2, prompts, save  # noqa: E402


def speed(args: argparse.Namespace) -> dict:
    from tandem import LLM, SamplingParams
    from tandem.bench.throughput import fixed_length, run_batch
    llms = {f: LLM(args.model, kv_cache_dtype=f, quantization=args.quantization, seed=0,
                   max_model_len=max(args.depths) + 200, enable_prefix_caching=False)
            for f in args.formats}
    tok = llms[args.formats[0]].llm_engine.tokenizer
    doc = " ".join(prompts(48))
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    out = {}
    for depth in args.depths:
        ids = fixed_length(tok, [doc], depth)
        rates: dict[str, list[float]] = {f: [] for f in args.formats}
        for r in range(args.rounds):
            for f in (args.formats if r % 2 == 0 else args.formats[::-1]):
                got = run_batch(llms[f].llm_engine, ids, params, f"{f}-{depth}-{r}")
                rates[f].append(got["generation_tokens_per_s"])
        base = statistics.median(rates[args.formats[0]])
        out[depth] = {f: statistics.median(v) for f, v in rates.items()}
        print(f"depth {depth}: " + ", ".join(f"{f} {v:.1f} tok/s ({v / base:.2f}x)"
                                            for f, v in out[depth].items()), flush=True)
    return out


def accuracy(args: argparse.Namespace) -> dict:
    from tandem import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    doc = " ".join(prompts(48))
    runs = {}
    for f in args.formats:
        llm = LLM(args.model, kv_cache_dtype=f, quantization=args.quantization, seed=0,
                  max_model_len=4096)
        tok = llm.llm_engine.tokenizer
        text = tok.decode(tok.encode(doc)[:1200])
        got = llm.generate([text], params, use_tqdm=False)[0]
        runs[f] = ([{t: lp.logprob for t, lp in pos.items()} for pos in got.prompt_logprobs[1:]],
                   got.prompt_token_ids[1:])
        del llm
    ref, ids = runs[args.formats[0]]
    out = {}
    for f in args.formats[1:]:
        lps = runs[f][0]
        top = sum(max(a, key=a.get) == max(b, key=b.get) for a, b in zip(ref, lps)) / len(ref)
        change = statistics.fmean(abs(a[t] - b[t]) for a, b, t in zip(ref, lps, ids))
        out[f] = {"top1_agreement": top, "mean_abs_logprob_change": change,
                  "positions": len(ref)}
        print(f"{f}: top-1 {top:.4f}, mean |d logprob| {change:.4f} nats over {len(ref)} "
              f"positions (against {args.formats[0]})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["speed", "accuracy"])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("-q", "--quantization", default="gguf")
    ap.add_argument("--formats", nargs="+",
                    default=["float32", "float16", "bfloat16", "q8_0", "fp8_e4m3"])
    ap.add_argument("--depths", type=int, nargs="+", default=[64, 1024, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from tandem.bench.common import cpu_name
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "model": args.model,
              "quantization": args.quantization, "formats": args.formats,
              args.mode: (speed if args.mode == "speed" else accuracy)(args)}
    print(f"saved {save(f'kv-cache-{args.mode}', result)} ({result['cpu']})")


if __name__ == "__main__":
    main()
