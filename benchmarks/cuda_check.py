"""Checks for a CUDA machine, where one is lent (the test suite runs on CPUs and needs none):
the engine on the default device ("auto": CUDA when present), with tiny models built here.

  1. float weights: speculative greedy output equals plain (same-vocabulary self-draft, k = 3);
  2. seeded sampling under "gumbel": the same tokens with no draft and with k = 3;
  3. a GGUF file (Q8_0, Q4_1, F16 and BF16 tensors) loads on CUDA, dequantized at load (the CPU
     kernels stay on the CPU), speculative greedy equals plain, and equals quantization="none";
  4. quantization="q4_k" on CUDA is refused with a clear error.

    python benchmarks/cuda_check.py [--out DIR]

Prints one line per check and writes cuda_check.json (to --out, default benchmarks/results).
Exits 1 if any check failed. Needs torch, transformers, tokenizers, pytest and gguf (the tiny GGUF
writer is the test suite's); no network.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPTS = ["The future of AI is", "Once upon a time", "1, 2, 3,"]


def tokens(llm: Any, params: Any) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def free() -> None:
    """After a check returns, its engines are garbage: give their device memory back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    from gguf import GGMLQuantizationType as Q
    from loader.test_gguf import _write_gguf
    from tiny_models import build_tiny_model
    from transformers import AutoModelForCausalLM

    from tandem import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="tandem-cuda-"))
    model = str(build_tiny_model(work / "llama", "llama", hidden=256))
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    print(json.dumps(results), flush=True)

    def draft(path: str, **extra: Any) -> dict:
        return {"model": path, "num_speculative_tokens": 3, "adaptive": False, **extra}

    def float_greedy() -> str:
        plain = LLM(model)
        device = str(plain.llm_engine.device)
        a = tokens(plain, greedy)
        spec = LLM(model, speculative_config=draft(model))
        b = tokens(spec, greedy)
        assert a == b, f"speculative {b} != plain {a}"
        return f"on {device}: {len(a)} prompts x 24 tokens equal"

    def seeded_gumbel() -> str:
        params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=7,
                                ignore_eos=True)
        plain = LLM(model, speculative_config=None)
        a = tokens(plain, params)
        spec = LLM(model, speculative_config=draft(model, rejection_sample_method="gumbel"))
        b = tokens(spec, params)
        assert a == b, f"k = 3 {b} != no draft {a}"
        return "equal"

    def gguf_file() -> str:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        state = hf.state_dict()
        types = {n: Q.Q8_0 if ".self_attn." in n else Q.Q4_1 for n in state
                 if n.endswith("proj.weight")}
        types["model.layers.0.mlp.up_proj.weight"] = Q.F16
        types["model.layers.0.self_attn.o_proj.weight"] = Q.BF16
        path = work / "tiny-q.gguf"
        _write_gguf(path, "llama", hf.config, state, types)
        kept = LLM(str(path), tokenizer=model)
        a = tokens(kept, greedy)
        spec = LLM(str(path), tokenizer=model, speculative_config=draft(model))
        b = tokens(spec, greedy)
        floats = LLM(str(path), tokenizer=model, quantization="none")
        c = tokens(floats, greedy)
        assert a == b, f"speculative {b} != plain {a}"
        if kept.llm_engine.device.type == "cuda":  # both dequantized there (on a CPU, the
            assert a == c, f"quantization='none' {c} != default {a}"  # kernels round x to int8)
        return (f"on {kept.llm_engine.device}: speculative (the float directory drafting) == "
                "plain (== quantization='none' on CUDA)")

    def q4k_refused() -> str:
        if not torch.cuda.is_available():
            return "skipped: no CUDA device"
        try:
            LLM(model, quantization="q4_k")
        except (ValueError, RuntimeError) as e:
            return f"refused: {e}"
        raise AssertionError("quantization='q4_k' on CUDA was accepted")

    checks: list[tuple[str, Callable[[], str]]] = [
        ("float_greedy_spec_equals_plain", float_greedy),
        ("seeded_gumbel_invariant", seeded_gumbel),
        ("gguf_on_default_device", gguf_file),
        ("q4_k_on_cuda_refused", q4k_refused)]
    failed = 0
    for name, check in checks:
        try:
            results[name] = {"ok": True, "detail": check()}
        except Exception as e:  # report every check, whichever fails
            failed += 1
            results[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-3000:]}
        free()
        print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'}: "
              f"{results[name]['detail'][:500]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_check.json").write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
