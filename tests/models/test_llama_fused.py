"""The fused decoder stack (models/llama_fused.py, kernels/cpu_decoder.c): bit-identical to the
layer-by-layer path on every Llama-family arch, used only where it applies, and lossless."""

from __future__ import annotations

import random

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.kernels import cpu as cpu_kernels
from tandem.models import llama, llama_fused


def _run(d: str, prompts: list[str], **kw) -> list:
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    llm = LLM(d, **kw)
    # The tiny models' norms are all ones: give each its own weights, the same in every run,
    # so a norm applied with the wrong weights would show.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(llm.llm_engine.model.named_parameters()):
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    out = llm.generate(prompts, sp, use_tqdm=False)
    return [(o.outputs[0].token_ids, [sorted(p.items()) for p in o.outputs[0].logprobs])
            for o in out]


@pytest.fixture
def calls(monkeypatch):
    """How many forwards ran fused / fell back to the layers."""
    seen = {"fused": 0, "layers": 0}
    real = llama_fused.fused_stack

    def counting(model, x, rope):
        out = real(model, x, rope)
        seen["fused" if out is not None else "layers"] += 1
        return out
    monkeypatch.setattr(llama, "fused_stack", counting)
    return seen


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_stack_is_bit_identical_to_the_layers(tiny_dirs, prompts, native_library,
                                                    monkeypatch, calls, arch):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    fused = _run(tiny_dirs[arch], prompts)
    assert calls["fused"] > 0 and cpu_kernels.enabled()  # decode steps ran fused
    monkeypatch.setattr(llama, "fused_stack", lambda model, x, rope: None)
    layers = _run(tiny_dirs[arch], prompts)
    assert fused == layers  # tokens and logprobs, to the bit


def long_step(d: str, monkeypatch, module, stack: str) -> list:
    """Prompts of 100 and 2,300 tokens under a budget of 1,200 tokens a step: the first step
    prefills the short one and 1,100 of the long one, the second decodes the short one's first
    token beside 1,199 more of the long one; the fused stack runs each in two sub-batches of 600
    rows (kernels/decoder_scratch.h's UBATCH), so a prompt is cut across sub-batches and steps and
    a decode row shares a sub-batch with a prefill. Then 8 tokens each. Every prompt position's
    logprob and the tokens'."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 300) for _ in range(n)]}
               for n in (100, 2300)]
    rows: list[int] = []
    real = getattr(module, stack)

    def watched(model, x, *rope):
        rows.append(x.shape[0])
        return real(model, x, *rope)
    monkeypatch.setattr(module, stack, watched)
    llm = LLM(d, max_model_len=2560, max_num_batched_tokens=1200)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2,
                        prompt_logprobs=1)
    out = llm.generate(prompts, sp, use_tqdm=False)
    assert rows[:2] == [1200, 1200]
    return [(o.outputs[0].token_ids, [sorted(p.items()) for p in o.outputs[0].logprobs],
             [sorted(p.items()) for p in o.prompt_logprobs[1:]]) for o in out]


def test_a_long_step_in_sub_batches_has_the_layers_bits(tiny_dirs, native_library, monkeypatch,
                                                        calls):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    fused = long_step(tiny_dirs["llama"], monkeypatch, llama, "fused_stack")
    assert calls["fused"] > 0
    monkeypatch.setattr(llama, "fused_stack", lambda model, x, rope: None)
    assert long_step(tiny_dirs["llama"], monkeypatch, llama, "fused_stack") == fused


def test_speculation_with_the_fused_stack_stays_lossless(tiny_dirs, prompts, native_library,
                                                         monkeypatch, calls):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    plain = _run(tiny_dirs["llama"], prompts)
    spec = _run(tiny_dirs["llama"], prompts, speculative_config={
        "model": tiny_dirs["llama_other"], "num_speculative_tokens": 3, "adaptive": False})
    assert [p[0] for p in spec] == [p[0] for p in plain]
    assert calls["fused"] > 0


def test_it_stays_off_where_a_piece_would_not_run_our_kernels(tiny_dirs, prompts,
                                                              native_library, monkeypatch,
                                                              calls):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "blas")  # BLAS matmuls: the layers run
    _run(tiny_dirs["llama"], prompts[:2])
    assert calls["fused"] == 0 and calls["layers"] > 0
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "auto")
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "torch")
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    calls["layers"] = 0
    _run(tiny_dirs["llama"], prompts[:2])  # no kernels: the torch layers
    assert calls["fused"] == 0 and calls["layers"] > 0
