"""Quantized weights through the engine (layers/quantized.py): lossless speculation on quantized
targets and drafts (same vocabulary and TLI), the fused stack bit-identical to the layers, GGUF
files kept in their blocks, random quantized weights, and the errors of bad settings."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from loader.test_gguf import _write_gguf
from tandem import LLM, SamplingParams
from tandem.layers.quantized import is_quantized
from tandem.models import llama
from tiny_models import build_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _tokens(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _quantized_layers(llm: LLM) -> int:
    return sum(is_quantized(m) for m in llm.llm_engine.model.modules())


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory) -> str:
    """A tiny llama whose rows (256, 512) Q4_K's super-blocks divide."""
    return str(build_tiny_model(tmp_path_factory.mktemp("wide") / "llama", "llama", hidden=256))


@pytest.mark.parametrize("mode", ["q8_0", "q4_0"])
def test_speculation_on_quantized_weights_equals_plain(tiny_dirs, prompts, native_library, mode):
    plain_llm = LLM(tiny_dirs["llama"], quantization=mode)
    assert _quantized_layers(plain_llm) > 0
    plain = _tokens(plain_llm, prompts)
    for draft in (tiny_dirs["llama"], tiny_dirs["llama_other"]):  # agreeing, and not at all
        spec = LLM(tiny_dirs["llama"], quantization=mode, speculative_config={
            "model": draft, "num_speculative_tokens": 3, "adaptive": False, "quantization": mode})
        draft_layers = [m for m in spec.llm_engine.draft_model.modules() if is_quantized(m)]
        assert draft_layers  # the draft is quantized too
        assert _tokens(spec, prompts) == plain


def test_q4_k_speculation_and_the_fused_stack(wide_llama, prompts, native_library, monkeypatch):
    calls = {"fused": 0}
    real = llama.fused_stack

    def counting(model, x, rope):
        out = real(model, x, rope)
        calls["fused"] += out is not None
        return out
    monkeypatch.setattr(llama, "fused_stack", counting)
    llm = LLM(wide_llama, quantization="q4_k")
    kinds = {t for m in llm.llm_engine.model.modules() if is_quantized(m) for t in m.qweight.types}
    assert kinds == {"Q4_K", "Q6_K"}  # the linear layers, and the embedding table (Q4_K_M's)
    fused = _tokens(llm, prompts)
    assert calls["fused"] > 0  # decode steps ran the whole quantized stack in one call
    spec = LLM(wide_llama, quantization="q4_k", speculative_config={
        "model": wide_llama, "num_speculative_tokens": 4, "adaptive": False,
        "quantization": "q4_k"})
    assert _tokens(spec, prompts) == fused
    monkeypatch.setattr(llama, "fused_stack", lambda model, x, rope: None)
    assert _tokens(LLM(wide_llama, quantization="q4_k"), prompts) == fused  # layer by layer


def test_q4_k_falls_back_where_256_does_not_divide_a_row(tiny_dirs, native_library):
    """Rows of the tiny llama are not a multiple of 256: its linear layers take Q4_0 and its
    vocabulary tables Q8_0 instead of Q4_K and Q6_K."""
    llm = LLM(tiny_dirs["llama"], quantization="q4_k")
    kinds = {t for m in llm.llm_engine.model.modules() if is_quantized(m) for t in m.qweight.types}
    assert kinds == {"Q4_0", "Q8_0"}


def test_a_tli_draft_on_quantized_weights_stays_lossless(tiny_dirs, tli_draft, prompts,
                                                         native_library):
    plain = _tokens(LLM(tiny_dirs["llama"], quantization="q8_0"), prompts)
    spec = LLM(tiny_dirs["llama"], quantization="q8_0", speculative_config={
        "model": tli_draft, "num_speculative_tokens": 3, "adaptive": False,
        "use_heterogeneous_vocab": True,
        "quantization": "q4_0"})
    assert spec.llm_engine.proposer.inputs.mapping is not None
    assert _tokens(spec, prompts) == plain


@pytest.fixture(scope="module")
def tiny_gguf(wide_llama, tmp_path_factory) -> Path:
    """A tiny llama (rows of 256 and 512) as a GGUF file that llama.cpp would write quantized:
    Q8_0 and Q4_1 layers, one F16 and one BF16 projection (kept, widened in registers), one Q2_K
    projection (no kernel: its layer is dequantized; random blocks, as gguf-py has no Q2_K
    quantizer), an F32 embedding table. Its tokenizer is the directory's (`tokenizer=`)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(wide_llama, dtype=torch.float32)
    config, state = model.config, model.state_dict()
    types = {n: Q.Q8_0 if ".self_attn." in n else Q.Q4_1 for n in state
             if n.endswith("proj.weight")}
    types["model.layers.0.mlp.up_proj.weight"] = Q.F16
    types["model.layers.0.self_attn.o_proj.weight"] = Q.BF16
    down = state["model.layers.1.mlp.down_proj.weight"]
    q2k = random_blocks_q2k(down.shape[0], down.shape[1])
    path = tmp_path_factory.mktemp("gguf") / "tiny-q.gguf"
    _write_gguf(path, "llama", config, state, types,
                blocks={"model.layers.1.mlp.down_proj.weight": (Q.Q2_K, q2k)})
    return path


def random_blocks_q2k(rows: int, k: int) -> np.ndarray:
    """uint8 [rows, k / 256 * 84]: Q2_K blocks of random bits with small float16 d and dmin."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (rows, k // 256, 84), dtype=np.uint8)
    for at in (80, 82):
        scales = rng.uniform(0, 0.01, (rows, k // 256)).astype(np.float16)
        raw[:, :, at:at + 2] = scales.view(np.uint8).reshape(rows, k // 256, 2)
    return raw.reshape(rows, -1)


def test_a_gguf_file_keeps_its_blocks_by_default(wide_llama, tiny_gguf, native_library, caplog):
    with caplog.at_level(logging.INFO, logger="tandem"):
        llm = LLM(str(tiny_gguf), tokenizer=wide_llama)
    text = caplog.text
    assert all(t in text for t in ("Q8_0", "Q4_1", "F16", "BF16"))  # the kept types, named
    assert "1 layer(s) dequantized to float32 at load (Q2_K: no quantized kernel)" in text
    model = llm.llm_engine.model
    assert is_quantized(model.model.layers[0].mlp.down_proj)
    assert is_quantized(model.model.layers[0].mlp.gate_up_proj)  # F16 up, Q4_1 gate: one weight
    assert is_quantized(model.model.layers[0].self_attn.o_proj)  # BF16
    assert not is_quantized(model.model.layers[1].mlp.down_proj)  # the Q2_K one
    assert model.model.layers[1].mlp.down_proj.weight.dtype == torch.float32
    ids = [[1, 5, 9, 14, 3, 7, 11]]
    native = llm.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    spec = LLM(str(tiny_gguf), tokenizer=wide_llama, speculative_config={
        "model": wide_llama, "num_speculative_tokens": 3, "adaptive": False,
        "quantization": "q8_0"})
    assert spec.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == native
    floats = LLM(str(tiny_gguf), tokenizer=wide_llama, quantization="none")
    assert _quantized_layers(floats) == 0


def test_random_quantized_weights_load_without_a_float_model(wide_llama, native_library):
    llm = LLM(wide_llama, load_format="dummy", quantization="q4_k")
    model = llm.llm_engine.model
    assert all(not p.is_meta for p in model.parameters() if p.dim() == 1)
    tables = 1 if model.config.tie_word_embeddings else 2  # embedding (and LM head)
    assert _quantized_layers(llm) == 2 * 4 + tables  # and two layers' four linears
    out = llm.generate(["hello"], GREEDY, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


def test_bad_quantization_settings_are_clear_errors(tiny_dirs, tiny_gguf, tmp_path):
    with pytest.raises(ValueError, match=r"quantization='awq' is not supported; choose one of "
                                         r"\['gguf', 'none', 'q8_0', 'q4_0', 'q4_k'\]"):
        LLM(tiny_dirs["llama"], quantization="awq")
    with pytest.raises(ValueError, match="float32 at tensor_parallel_size 1 only .*dtype is "
                                         "torch.bfloat16"):
        LLM(tiny_dirs["llama"], quantization="q4_k", dtype="bfloat16")
    with pytest.raises(ValueError, match="tensor_parallel_size=2 would split"):
        LLM(tiny_dirs["llama"], quantization="q8_0", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="speculative_config.quantization='int4' is not supported"):
        LLM(tiny_dirs["llama"], speculative_config={
            "model": tiny_dirs["llama"], "num_speculative_tokens": 2, "quantization": "int4"})
    with pytest.raises(ValueError, match="needs a GGUF file"):
        LLM(tiny_dirs["llama"], quantization="gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:-5000])
    with pytest.raises(ValueError, match="truncated.gguf is truncated: tensor .* Download it"):
        LLM(str(truncated), tokenizer=tiny_dirs["llama"])


def test_quantized_weights_need_the_kernels(tiny_dirs, tiny_gguf, monkeypatch, caplog):
    from tandem.kernels import cpu as cpu_kernels
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "torch")
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    with pytest.raises(ValueError, match="quantization='q8_0' needs the CPU kernels"):
        LLM(tiny_dirs["llama"], quantization="q8_0")
    with caplog.at_level(logging.INFO, logger="tandem"):
        llm = LLM(str(tiny_gguf), tokenizer=tiny_dirs["llama"])  # float32 instead, said so
    assert "dequantized to float32 at load (the CPU kernels are off" in caplog.text
    assert _quantized_layers(llm) == 0
