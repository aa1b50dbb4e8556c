"""The fused Gemma 3 stack (models/gemma3_fused.py, kernels/cpu_decoder_gemma.c): bit-identical to
the layer-by-layer path, float32 and quantized, across the sliding window, used only where it
applies, and lossless under speculation; and the GELU-tanh kernel it runs (cpu_kernels.c)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem import LLM, SamplingParams
from tandem.kernels import cpu as cpu_kernels
from tandem.models import gemma3, gemma3_fused
from test_llama_fused import long_step
from tiny_models import build_tiny_model

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory) -> dict[str, str]:
    """A tiny Gemma 3 (sliding, sliding, full layers; local rope base 1000, global 100000) with
    a sliding window of 4, shorter than every prompt but one, and in-features that are
    multiples of 256 (hidden 256, 4 heads of 64, intermediate 512) so Q4_K quantizes every
    linear; and a random same-vocabulary draft."""
    root = tmp_path_factory.mktemp("gemma3-fused")
    return {"target": str(build_tiny_model(root / "target", "gemma3", hidden=256, head_dim=64,
                                           sliding_window=4)),
            "draft": str(build_tiny_model(root / "draft", "gemma3", seed=1))}


def _run(d: str, prompts: list[str], **kw) -> list:
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
    llm = LLM(d, **kw)
    # A tiny model's (1 + w) norms are all ones: give each its own weights, the same in every
    # run, so a norm skipped or applied with the wrong weights would show.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(llm.llm_engine.model.named_parameters()):
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    out = llm.generate(prompts, sp, use_tqdm=False)
    return [(o.outputs[0].token_ids, [sorted(p.items()) for p in o.outputs[0].logprobs])
            for o in out]


@pytest.fixture
def calls(monkeypatch):
    """How many forwards ran fused / fell back to the layers, and the last model seen."""
    seen = {"fused": 0, "layers": 0, "model": None}
    real = gemma3_fused.gemma_stack

    def counting(model, x, rope_local, rope_global):
        out = real(model, x, rope_local, rope_global)
        seen["fused" if out is not None else "layers"] += 1
        seen["model"] = model
        return out
    monkeypatch.setattr(gemma3, "gemma_stack", counting)
    return seen


@pytest.mark.parametrize("quantization", [None, "q8_0", "q4_k"])
def test_fused_stack_is_bit_identical_to_the_layers(gemma_dirs, prompts, native_library,
                                                    monkeypatch, calls, quantization):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    kw = {"quantization": quantization} if quantization else {}
    fused = _run(gemma_dirs["target"], prompts, **kw)
    assert calls["fused"] >= MAX_TOKENS - 1 and cpu_kernels.enabled()  # decode steps ran fused
    plan = calls["model"]._fused_plan
    assert plan.dims[5] == (quantization is not None)  # on quantized weights where asked
    assert plan.kinds.tolist() == [[4, 1], [4, 1], [0, 0]]  # window and rope table per layer
    monkeypatch.setattr(gemma3, "gemma_stack", lambda model, x, rl, rg: None)
    layers = _run(gemma_dirs["target"], prompts, **kw)
    assert fused == layers  # tokens and logprobs, to the bit


def test_a_long_step_in_sub_batches_has_the_layers_bits(gemma_dirs, native_library, monkeypatch,
                                                        calls):
    """test_llama_fused's long steps (1,200 rows in two sub-batches each) across the window."""
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    fused = long_step(gemma_dirs["target"], monkeypatch, gemma3, "gemma_stack")
    assert calls["fused"] > 0
    monkeypatch.setattr(gemma3, "gemma_stack", lambda model, x, rl, rg: None)
    assert long_step(gemma_dirs["target"], monkeypatch, gemma3, "gemma_stack") == fused


def test_speculation_with_the_fused_stack_stays_lossless(gemma_dirs, prompts, native_library,
                                                         monkeypatch, calls):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    plain = _run(gemma_dirs["target"], prompts)
    calls["fused"] = 0
    spec = _run(gemma_dirs["target"], prompts, speculative_config={
        "model": gemma_dirs["draft"], "num_speculative_tokens": 3, "adaptive": False})
    assert [p[0] for p in spec] == [p[0] for p in plain]
    assert calls["fused"] > 0  # verification (and the Gemma draft's steps) ran fused


def test_it_stays_off_where_a_piece_would_not_run_the_c_stack(gemma_dirs, prompts,
                                                              native_library, monkeypatch,
                                                              calls):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "blas")  # BLAS matmuls: the layers run
    llm = LLM(gemma_dirs["target"])
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert calls["fused"] == 0 and calls["layers"] > 0
    model = llm.llm_engine.model.model
    assert gemma3_fused._plan(model) is not None
    attn = model.layers[1].self_attn.attn
    attn.softcap = 50.0  # Gemma 2's soft-capped scores: not in the C attention
    assert gemma3_fused._plan(model) is None
    attn.softcap = None
    model.layers[2].mlp.act = torch.nn.functional.silu
    assert gemma3_fused._plan(model) is None


def test_gelu_tanh_kernel_accuracy_and_batch_independence(fused):
    """On the native build and, on an AVX-512 machine, the AVX2 one (conftest's `library`)."""
    x = torch.linspace(-12, 12, 200_001)  # [n]; 200_001: the last row's tail is not a vector
    up = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    ours = cpu_kernels.gelu_tanh_and_mul(torch.cat([x, up])[None])[0]
    exact = F.gelu(x.double(), approximate="tanh") * up.double()
    # Against float64: within 1e-6 relative + 2e-10 absolute (the absolute part matters only
    # far left, around x = -3.5, where the result is ~1e-4 of |x| and falling).
    assert ((ours.double() - exact).abs() <= 1e-6 * exact.abs() + 2e-10).all()
    # Against torch's float32, within 1e-6 relative + half an ulp of 1 times |x up|: torch's
    # 1 + tanh(u) cancels as tanh(u) nears -1 and loses up to that much itself (3e-8 |x up|
    # here), which ours, computed as x / (1 + exp(-2u)), does not.
    torch_f32 = F.gelu(x, approximate="tanh") * up
    bound = 1e-6 * torch_f32.abs() + 6e-8 * (x * up).abs()
    assert ((ours - torch_f32).abs() <= bound).all()
    # A row's bits never depend on its batch.
    rows = torch.randn(5, 2 * 37, generator=torch.Generator().manual_seed(1)) * 4
    batch = cpu_kernels.gelu_tanh_and_mul(rows)
    for i in range(rows.shape[0]):
        assert torch.equal(cpu_kernels.gelu_tanh_and_mul(rows[i:i + 1].contiguous())[0],
                           batch[i])
