"""vLLM's example pair on one CPU machine: a Qwen3-8B-shaped target and a Qwen3-0.6B-shaped draft,
both with random Q4_K weights (load_format "dummy", quantization "q4_k": only the configs exist,
and each tensor is drawn and quantized in slices, so no float model is ever built).

Reports what loading the pair added to the process (resident memory, against the Q4_K size of
the weights and the KV budget), plain decode tokens/s, and speculation at synthetic acceptance
(each draft position accepted with probability `--acceptance` given the ones before were: NOT
lossless, benchmarking only, see sample/synthetic_sampler.py) with k = `--k`, measured against
plain on the same engine in interleaved rounds, next to the speedup predicted from the
acceptance and the draft/target cost ratio c (E(k) / (k c + 1), as `tandem bench spec`), and
next to the prediction that also counts what verifying k + 1 tokens costs against decoding one
(E(k) T(1) / (T(k + 1) + k D), the times of the engine's load-time calibration: on a CPU a
verification is not free, which the standard formula assumes).

    python benchmarks/bench_8b_quant.py [--tokens 24] [--rounds 2]

Writes benchmarks/results/bench_8b_quant.json. About 10 GB of memory; on 2 cores, minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer builder (no download)

from bench_gpu import QWEN3_06B, QWEN3_8B, TINY, write_config  # noqa: E402

from tandem.bench.common import cpu_name, rss_mb  # noqa: E402
from tandem.bench.latency import run_one  # noqa: E402
from tandem.bench.spec import _decode_rate  # noqa: E402


def weight_bytes(llm, role: str) -> int:
    """Bytes of a model's weights as they are held (quantized blocks, or float tensors)."""
    from tandem.layers.quantized import QuantizedWeight
    model = llm.llm_engine.executor.models[role]
    total = 0
    for module in model.modules():
        q = getattr(module, "qweight", None)
        if isinstance(q, QuantizedWeight):
            total += q.nbytes
        for name, p in module.named_parameters(recurse=False):
            if p.device.type != "meta" and not (isinstance(q, QuantizedWeight) and name == "weight"):
                total += p.numel() * p.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.8,
                    help="conditional acceptance per draft position")
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kv-gib", type=float, default=1.0, help="KV budget per engine (GiB)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quantization", default="q4_k")
    ap.add_argument("--smoke", action="store_true",
                    help="two tiny models: checks the script, measures nothing")
    ap.add_argument("--output", type=Path,
                    default=ROOT / "benchmarks" / "results" / "bench_8b_quant.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from tandem import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="tandem-8b-"))  # configs and tokenizers only
    shapes = (TINY, TINY) if args.smoke else (QWEN3_8B, QWEN3_06B)
    vocab = 2048 if args.smoke else 151936
    target = write_config(work / "qwen3-8b-shaped", shapes[0], vocab)
    draft = write_config(work / "qwen3-0.6b-shaped", shapes[1], vocab)
    rates = [args.acceptance ** (i + 1) for i in range(args.k)]
    common = dict(load_format="dummy", quantization=args.quantization, dtype="float32",
                  max_model_len=1024, enable_prefix_caching=False,
                  kv_cache_memory_bytes=int(args.kv_gib * 1024**3))
    before = rss_mb()
    t0 = time.perf_counter()
    llm = LLM(model=target, speculative_config={  # adaptive only for its calibration's timings
        "model": draft, "num_speculative_tokens": args.k, "adaptive": True,
        "quantization": args.quantization,
        "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}, **common)
    load_s = time.perf_counter() - t0
    added = rss_mb() - before
    sizes = {role: weight_bytes(llm, role) / 1024**2 for role in ("target", "draft")}
    print(f"loaded in {load_s:.0f} s; weights held: target {sizes['target']:.0f} MiB, draft "
          f"{sizes['draft']:.0f} MiB; KV budget {args.kv_gib:.1f} GiB per engine; loading added "
          f"{added:.0f} MiB to the process", flush=True)

    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompts = ["The future of AI is"]
    drafting = llm.llm_engine.drafting
    cal = drafting.calibration  # target passes over 1 .. k + 1 tokens, a draft pass (seconds)
    t_one, t_verify, t_draft = cal.target(1), cal.target(args.k + 1), cal.draft(1)
    drafting.set_policy(args.k)  # fixed k from here on (set_policy(k) turns adaptive off)
    run_one(llm.llm_engine, prompts[0], SamplingParams(max_tokens=4, temperature=0), "warmup")
    plain, spec, lengths = [], [], []
    for r in range(args.rounds):  # interleaved: plain, speculative, plain
        drafting.set_policy(0)
        a = _decode_rate(llm, prompts, params)[0]
        drafting.set_policy(args.k)
        rate, _, length = _decode_rate(llm, prompts, params)
        drafting.set_policy(0)
        b = _decode_rate(llm, prompts, params)[0]
        plain.append((a + b) / 2)
        spec.append(rate)
        lengths.append(length)
        print(f"round {r + 1}: plain {plain[-1]:.2f} tok/s, k={args.k} {rate:.2f} tok/s "
              f"(mean acceptance length {length:.2f})", flush=True)
    del llm

    # c, the draft's cost per token over the target's: the draft alone against plain decoding
    draft_llm = LLM(model=draft, **common)
    run_one(draft_llm.llm_engine, prompts[0], SamplingParams(max_tokens=4, temperature=0), "w")
    draft_rate = _decode_rate(draft_llm, prompts, params)[0]
    target_rate = statistics.median(plain)
    c = target_rate / draft_rate
    length = statistics.median(lengths)
    expected = sum(args.acceptance ** i for i in range(args.k + 1))
    predicted = expected / (args.k * c + 1)
    predicted_verify = expected * t_one / (t_verify + args.k * t_draft)
    measured = statistics.median(s / p for s, p in zip(spec, plain))
    result = {
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "quantization": args.quantization,
        "smoke": args.smoke, "target_shape": shapes[0], "draft_shape": shapes[1], "load_seconds": load_s,
        "weights_mib": sizes, "kv_budget_gib_per_engine": args.kv_gib,
        "load_added_mib": added, "peak_rss_mib": rss_mb(),
        "k": args.k, "tokens": args.tokens, "acceptance": args.acceptance,
        "synthetic_acceptance_rates": rates,
        "plain_tokens_per_s": plain, "speculative_tokens_per_s": spec,
        "mean_acceptance_length": lengths, "expected_acceptance_length": expected,
        "draft_alone_tokens_per_s": draft_rate, "cost_ratio_c": c,
        "speedup_measured": measured, "speedup_predicted": predicted,
        "calibration_ms": {"target_1": 1e3 * t_one, f"target_{args.k + 1}": 1e3 * t_verify,
                           "draft_pass": 1e3 * t_draft},
        "speedup_predicted_with_verify_cost": predicted_verify}
    print(f"plain {target_rate:.2f} tok/s; draft alone {draft_rate:.1f} tok/s (c = {c:.3f}); "
          f"k={args.k}: {measured:.2f}x measured, {predicted:.2f}x predicted (acceptance length "
          f"{length:.2f}, expected {expected:.2f}); counting the verification's cost (a target "
          f"pass over {args.k + 1} tokens {1e3 * t_verify:.1f} ms against {1e3 * t_one:.1f} ms "
          f"for one, a draft pass {1e3 * t_draft:.1f} ms): {predicted_verify:.2f}x predicted; "
          f"CPU: {cpu_name()}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
