"""tandem vs transformers `generate` on SmolLM2-135M (bundled GGUF, float32), in one run.

Prints single-stream decode tokens/s and the throughput of 16 concurrent prompts for both, and
their ratios. Greedy decoding with ignore_eos so every run produces the same number of tokens.
Run on a quiet machine: `.venv/bin/python benchmarks/bench_core.py [--tokens 128] [--threads 2]`.
"""

from __future__ import annotations

import argparse
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import SMOLLM2, prompts, save, timed  # noqa: E402


def bench_tandem(tokens: int, concurrent: int) -> dict:
    from tandem import LLM, SamplingParams
    llm = LLM(SMOLLM2, dtype="float32", enable_prefix_caching=False)
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts(1), SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
    t1, _ = timed(lambda: llm.generate(prompts(1), sp, use_tqdm=False))
    tn, outs = timed(lambda: llm.generate(prompts(concurrent), sp, use_tqdm=False))
    assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
    return {"single_stream_tok_s": tokens / t1, "concurrent_tok_s": concurrent * tokens / tn}


def bench_transformers(tokens: int, concurrent: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.loader.model_source import resolve_model
    src = resolve_model(SMOLLM2)
    name = src.gguf_file.name
    tok = AutoTokenizer.from_pretrained(str(src.model_dir), gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(str(src.model_dir), gguf_file=name,
                                                 dtype=torch.float32).eval()

    def gen(texts: list[str]) -> None:
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        batch = tok(texts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        assert out.shape[1] == batch.input_ids.shape[1] + tokens

    gen(prompts(1))  # warm-up
    t1, _ = timed(lambda: gen(prompts(1)))
    tn, _ = timed(lambda: gen(prompts(concurrent)))
    return {"single_stream_tok_s": tokens / t1, "concurrent_tok_s": concurrent * tokens / tn}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ours = bench_tandem(args.tokens, args.concurrent)
    ref = bench_transformers(args.tokens, args.concurrent)
    ratios = {
        "single_stream_vs_transformers": ours["single_stream_tok_s"] / ref["single_stream_tok_s"],
        "concurrent_vs_transformers_single_stream":
            ours["concurrent_tok_s"] / ref["single_stream_tok_s"],
        "concurrent_vs_transformers_batched": ours["concurrent_tok_s"] / ref["concurrent_tok_s"],
    }
    print(f"SmolLM2-135M float32, {args.threads} threads, {args.tokens} greedy tokens per prompt")
    print(f"{'':34s}{'tandem':>10s}{'transformers':>14s}")
    print(f"{'single stream (tok/s)':34s}{ours['single_stream_tok_s']:10.1f}"
          f"{ref['single_stream_tok_s']:14.1f}")
    print(f"{f'{args.concurrent} concurrent prompts (tok/s)':34s}{ours['concurrent_tok_s']:10.1f}"
          f"{ref['concurrent_tok_s']:14.1f}")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    path = save("core", {"tokens": args.tokens, "concurrent": args.concurrent, "tandem": ours,
                         "transformers": ref, "ratios": ratios})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
