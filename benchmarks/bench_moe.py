"""Decode speed of a Qwen3-MoE shape with random weights (load_format="dummy"), quantized at load.

    flock -x /tmp/tandem-heavy.lock python benchmarks/bench_moe.py --layers 8 --quantization q4_k

The shape is Qwen3-30B-A3B's (hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128 experts,
8 per token, expert FFN 768, vocabulary 151,936) with `--layers` of its 48 layers, so that it
fits a small machine; the time per layer is the same in the full model. The output is noise
(random weights): this measures speed only. Prints JSON: load seconds, single-stream decode
tokens/s, and the same at a batch of 4 streams (experts shared by several rows are read once).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's tandem
sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer builder (no download)


def write_config(out: Path, layers: int) -> None:
    from transformers import Qwen3MoeConfig

    from tiny_models import build_bytelevel_tokenizer

    tok = build_bytelevel_tokenizer(out)  # any tokenizer: the vocabulary is padded to 151,936
    Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                   moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                   norm_topk_prob=True, num_hidden_layers=layers, num_attention_heads=32,
                   num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                   rope_theta=1000000.0, tie_word_embeddings=False,
                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   architectures=["Qwen3MoeForCausalLM"]).save_pretrained(out)


def decode_rate(llm, streams: int, tokens: int) -> float:
    from tandem import SamplingParams

    prompts = [{"prompt_token_ids": [10 + i, 20, 30, 40, 50, 60, 70, 80]} for i in range(streams)]
    short = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True)
    llm.generate(prompts, short, use_tqdm=False)  # warm-up: kernel choices for these shapes
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        llm.generate(prompts, short, use_tqdm=False)  # prefill and the first token
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        llm.generate(prompts, full, use_tqdm=False)
        best = min(best, time.perf_counter() - t0 - prefill)
    return streams * tokens / best


@contextlib.contextmanager
def locked(path: str, exclusive: bool) -> Iterator[None]:
    """The machine's shared (loading) or exclusive (timing) lock, where one is given."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quantization", default="q4_k")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--lock", default="", help="a lock file: shared while loading, exclusive "
                    "while timing (e.g. /tmp/tandem-heavy.lock)")
    args = ap.parse_args()
    from tandem import LLM
    from tandem.bench.common import machine

    with tempfile.TemporaryDirectory() as d:
        with locked(args.lock, exclusive=False):
            write_config(Path(d), args.layers)
            t0 = time.perf_counter()
            llm = LLM(d, load_format="dummy", quantization=args.quantization, max_model_len=512)
            load = time.perf_counter() - t0
        with locked(args.lock, exclusive=True):
            rates = {f"decode_tok_s_{n}": round(decode_rate(llm, n, args.tokens), 2)
                     for n in (1, 4)}
        result = {"shape": f"Qwen3-30B-A3B, {args.layers} of 48 layers",
                  "quantization": args.quantization, "load_s": round(load, 1), **rates,
                  "machine": machine()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
