"""Long sequences of a Qwen3-8B-shaped model on one CPU machine (issue 43): random Q4_K weights
(load_format "dummy", quantization "q4_k", as bench_8b_quant.py), a KV cache of `--kv-cache-dtype`
(q8_0 by default) sized for exactly `--seqs` sequences of `--depth` prompt tokens plus the
tokens they generate, and all of them admitted at once. The engine prefills them in its chunks
of 2,048 tokens, one after another (the first decodes beside the second's prefill, ...), so by
default each generates enough tokens (`--tokens`, 16 more than the other prompts' prefill steps)
that none finishes before the last is prefilled: for a while every sequence is at depth.

Reports the KV budget in bytes and blocks, the most blocks in use at once (every sequence's:
they were held together), the process's peak resident memory against the machine's,
preemptions (0), each first token's time, and the decode rate over the steps where every
sequence decoded.

    python benchmarks/bench_long_8b.py [--seqs 4] [--depth 16384] [--tokens 16]

Writes benchmarks/results/bench_long_8b.json. On 2 cores the 4 x 16k prefill takes about an hour.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer builder (no download)

from bench_gpu import QWEN3_8B, TINY, write_config  # noqa: E402

from tandem.bench.common import cpu_name, process_memory, rss_mb  # noqa: E402


def mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--depth", type=int, default=16384, help="prompt tokens per sequence")
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens generated per sequence (default: the other prompts' prefill "
                         "steps + 16)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-cache-dtype", default=None,
                    help="q8_0 by default; float16 with --smoke (its head of 16 is below a q8_0 "
                         "block)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--smoke", action="store_true", help="a tiny model: checks the script")
    ap.add_argument("--output", type=Path,
                    default=ROOT / "benchmarks" / "results" / "bench_long_8b.json")
    args = ap.parse_args()
    from tandem import LLM, SamplingParams

    shape, vocab = (TINY, 2048) if args.smoke else (QWEN3_8B, 151936)
    if args.kv_cache_dtype is None:
        args.kv_cache_dtype = "float16" if args.smoke else "q8_0"
    if args.tokens is None:
        args.tokens = (args.seqs - 1) * -(-args.depth // args.max_num_batched_tokens) + 16
    length = args.depth + args.tokens
    work = Path(tempfile.mkdtemp(prefix="tandem-long-8b-"))
    target = write_config(work / "qwen3-8b-shaped", shape, vocab,
                          max_position_embeddings=max(40960, length))
    # a budget above what the sequences need: max_num_seqs caps the cache at exactly their blocks
    llm = LLM(model=target, load_format="dummy", quantization="q4_k", dtype="float32",
              kv_cache_dtype=args.kv_cache_dtype, max_model_len=length,
              block_size=args.block_size, max_num_seqs=args.seqs, enable_prefix_caching=False,
              max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_memory_bytes=64 << 30)
    engine = llm.llm_engine
    from tandem.worker.kv_cache import bytes_per_block
    kv_bytes = engine.num_blocks * bytes_per_block(
        [(engine.model, engine.model.attention_layers()[0].kv_format)], args.block_size)
    loaded_mib = rss_mb()
    print(f"loaded: {loaded_mib:.0f} MiB resident; KV cache {engine.num_blocks} blocks of "
          f"{args.block_size} tokens, {kv_bytes / 2**30:.2f} GiB ({args.kv_cache_dtype})",
          flush=True)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    for i in range(args.seqs):  # distinct prompts: nothing shared between the sequences
        engine.add_request(f"s{i}", [rng.randrange(3, 1000) for _ in range(args.depth)], params,
                           final_only=False)
    t0 = time.perf_counter()
    first: dict[str, float] = {}
    done: dict[str, int] = {}
    decode_steps: list[float] = []
    peak_blocks = 0
    last = t0
    while engine.has_unfinished_requests():
        all_decoding = len(first) == args.seqs and not done  # a step of every sequence at depth
        outs = engine.step()
        now = time.perf_counter()
        peak_blocks = max(peak_blocks, engine.num_blocks - engine.kv.num_free_blocks)
        if all_decoding and not any(o.finished for o in outs):
            decode_steps.append(now - last)
        for o in outs:
            if o.outputs[0].token_ids and o.request_id not in first:
                first[o.request_id] = now - t0
                print(f"{o.request_id}: first token after {first[o.request_id]:.0f} s",
                      flush=True)
            if o.finished:
                done[o.request_id] = len(o.outputs[0].token_ids)
        last = now
    total = time.perf_counter() - t0
    preempted = engine.scheduler.num_preemptions
    decode_rate = args.seqs * len(decode_steps) / sum(decode_steps) if decode_steps else 0.0
    peak_mib = process_memory()["peak_rss_mb"]
    result = {"cpu": cpu_name(), "smoke": args.smoke, "shape": shape, "seqs": args.seqs,
              "depth": args.depth, "tokens": args.tokens, "kv_cache_dtype": args.kv_cache_dtype,
              "kv_blocks": engine.num_blocks, "kv_bytes": kv_bytes,
              "peak_blocks_in_use": peak_blocks,
              "loaded_rss_mib": loaded_mib, "peak_rss_mib": peak_mib,
              "machine_memory_gib": mem_total_gib(), "preemptions": preempted,
              "first_token_s": first, "generated": done, "total_s": total,
              "prefill_tokens_per_s": args.seqs * args.depth / max(first.values()),
              "decode_steps_all_at_depth": len(decode_steps),
              "decode_tokens_per_s_at_depth": decode_rate}
    print(json.dumps(result, indent=2), flush=True)
    assert preempted == 0 and all(n == args.tokens for n in done.values()), result
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(args.output)

if __name__ == "__main__":
    main()
