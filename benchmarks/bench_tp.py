"""Tensor parallelism, tp=1 vs tp=2, in one run: greedy tokens/s of one stream and of 16
concurrent prompts on the bundled Gemma 3 270M (4 heads, 1 KV head, replicated at tp=2; SmolLM2's
9 heads do not split in two), and whether the tokens are identical.

On a 2-core CPU both ranks share the same two cores (one thread each at tp=2), so this measures
the cost of sharding (an all-reduce after every attention and MLP block, a gather of the logits,
a broadcast of every batch) rather than a speedup; tensor parallelism pays where a model does not
fit one device or where each rank has cores (or a GPU) of its own.
`.venv/bin/python benchmarks/bench_tp.py [--tokens 64] [--prompts 16]`
"""

from __future__ import annotations

import argparse
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_tli import cpu_name  # noqa: E402
from common import prompts, save, timed  # noqa: E402

GEMMA3 = "google/gemma-3-270m"


def instrument() -> dict[str, float]:
    """Time rank 0 spends in collectives (all-reduce, all-gather, the batch broadcast), which
    includes waiting for the other rank to arrive, and the number of forwards."""
    import time

    from tandem.distributed.executor import MultiprocExecutor
    from tandem.distributed.parallel_state import TPGroup

    comm = {"seconds": 0.0, "forwards": 0}

    def timing(fn, counts_forwards: bool = False):
        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                comm["seconds"] += time.perf_counter() - t0
                if counts_forwards and isinstance(args[1], tuple) and args[1][0] == "forward":
                    comm["forwards"] += 1
        return wrapped

    TPGroup.all_reduce = timing(TPGroup.all_reduce)
    TPGroup.all_gather = timing(TPGroup.all_gather)
    MultiprocExecutor._send = timing(MultiprocExecutor._send, counts_forwards=True)
    return comm


def rates(llm, texts: list[str], sp) -> tuple[float, float, list[list[int]]]:
    llm.generate(texts[:1], sp, use_tqdm=False)  # warm-up
    t_one, one = timed(lambda: [llm.generate([t], sp, use_tqdm=False)[0] for t in texts[:4]])
    t_all, outs = timed(lambda: llm.generate(texts, sp, use_tqdm=False))
    single = sum(len(o.outputs[0].token_ids) for o in one) / t_one
    batch = sum(len(o.outputs[0].token_ids) for o in outs) / t_all
    return single, batch, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    args = ap.parse_args()
    from tandem import LLM, SamplingParams

    texts = prompts(args.prompts)
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    results = {}
    comm = instrument()
    for tp in (1, 2):
        llm = LLM(GEMMA3, tensor_parallel_size=tp, dtype="float32", disable_log_stats=True)
        results[tp] = rates(llm, texts, sp)
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    (s1, b1, o1), (s2, b2, o2) = results[1], results[2]
    result = {"cpu": cpu_name(), "cpus": os.cpu_count(), "model": GEMMA3,
              "tokens_per_prompt": args.tokens, "prompts": args.prompts,
              "tp1": {"single_tok_s": s1, "batch_tok_s": b1},
              "tp2": {"single_tok_s": s2, "batch_tok_s": b2},
              "tp2_over_tp1": {"single": s2 / s1, "batch": b2 / b1},
              "identical_tokens": o1 == o2,
              "tp2_collective_ms_per_forward": 1000 * comm["seconds"] / max(1, comm["forwards"]),
              "tp2_forwards": comm["forwards"]}
    print(f"CPU: {result['cpu']} ({result['cpus']} cores)")
    print(f"one stream: tp=1 {s1:.1f} tok/s, tp=2 {s2:.1f} tok/s ({s2 / s1:.2f}x)")
    print(f"{args.prompts} prompts: tp=1 {b1:.1f} tok/s, tp=2 {b2:.1f} tok/s ({b2 / b1:.2f}x)")
    print(f"identical greedy tokens: {o1 == o2}")
    print(f"tp=2 rank 0 in collectives (incl. waiting for rank 1): "
          f"{result['tp2_collective_ms_per_forward']:.1f} ms per forward over "
          f"{comm['forwards']} forwards")
    print(f"saved {save('tp', result)}")


if __name__ == "__main__":
    main()
