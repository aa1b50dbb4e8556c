"""GGUF loading: real bundled files against transformers' own GGUF loader, and tiny GGUF files written
here from random HF models (llama/qwen2/qwen3/gemma3) to check names, shapes, the llama q/k row
permutation, Gemma's +1 norms and every dequantizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from tandem.loader.gguf_loader import (dequantize_tensor, iter_gguf_tensors, load_gguf_config,
                                       load_gguf_tokenizer, read_gguf)

if TYPE_CHECKING:
    from .conftest import Loaded

# ------------------------------------------------------------------------------------------------
# Real files vs transformers
# ------------------------------------------------------------------------------------------------

KEY_FIELDS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters",
              "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"]
GEMMA_FIELDS = ["sliding_window", "layer_types", "query_pre_attn_scalar", "final_logit_softcapping",
                "attn_logit_softcapping", "hidden_activation"]


def test_config_matches_transformers(ours: Loaded, reference: Loaded) -> None:
    assert type(ours.config) is type(reference.config)
    fields = KEY_FIELDS + (GEMMA_FIELDS if ours.name == "gemma3" else [])
    for field in fields:
        assert getattr(ours.config, field) == getattr(reference.config, field), field
    expected_arch = {"smollm2": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}[ours.name]
    assert ours.config.architectures == [expected_arch]


def test_tensors_match_transformers(ours: Loaded, reference: Loaded) -> None:
    expected = dict(reference.tensors)
    if reference.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert set(ours.tensors) == set(expected)
    for name, tensor in ours.tensors.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == expected[name].shape, name
        if not torch.equal(tensor, expected[name]):  # both dequantize the same bytes: usually bit-equal
            torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0, msg=name)


def test_smollm2_known_values(ours: Loaded) -> None:
    """Independent of transformers: the architecture numbers of models.md, and that the q rows really
    were un-permuted (each head's rows of a rotate-half layout differ from the interleaved file order)."""
    if ours.name != "smollm2":
        pytest.skip("SmolLM2 only")
    c = ours.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (30, 576, 9, 3, 64)
    assert c.tie_word_embeddings and "lm_head.weight" not in ours.tensors
    assert c.rope_parameters["rope_theta"] == 100000.0
    raw = dequantize_tensor(read_gguf(ours.path), read_gguf(ours.path).tensors["blk.0.attn_q.weight"])
    assert not torch.equal(raw, ours.tensors["model.layers.0.self_attn.q_proj.weight"])


def test_smollm2_load_is_fast(ours: Loaded) -> None:
    if ours.name != "smollm2":
        pytest.skip("SmolLM2 only")
    assert ours.seconds < 10.0, f"loading SmolLM2's GGUF took {ours.seconds:.1f} s"


def test_tokenizer_smollm2(bundled_path: Callable[[str], Path]) -> None:
    tok = load_gguf_tokenizer(bundled_path("smollm2"))
    assert tok("Hello, my name is").input_ids == [19556, 28, 957, 1462, 314]
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and len(tok) == 49152


def test_tokenizer_gemma3(bundled_path: Callable[[str], Path]) -> None:
    tok = load_gguf_tokenizer(bundled_path("gemma3"))
    assert tok.chat_template is None
    ids = tok("Hello, my name is").input_ids
    assert ids == [2, 9259, 236764, 1041, 1463, 563]  # starts with <bos>, as Gemma needs
    assert tok.decode(ids, skip_special_tokens=True) == "Hello, my name is"
    assert len(tok) == 262144 and tok.eos_token == "<eos>"


# ------------------------------------------------------------------------------------------------
# Tiny GGUF files written from random HF models
# ------------------------------------------------------------------------------------------------

# HF per-layer name -> GGUF name, written out independently of the loader's tables.
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_GEMMA_LAYER = {**_LAYER, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def _gguf_name(hf: str, arch: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{(_GEMMA_LAYER if arch == 'gemma3' else _LAYER)[module]}.{suffix}"


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny(arch: str, tie: bool) -> Any:
    import transformers

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config, "gemma3": transformers.Gemma3TextConfig}[arch]
    gemma_rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    extra = {"gemma3": dict(sliding_window=32, query_pre_attn_scalar=16, rope_parameters=gemma_rope),
             "qwen2": dict(head_dim=16)}.get(arch, {"rope_theta": 5e5})
    config = cls(**{**common, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # norms default to 1 (or 0 for Gemma): make them distinct so mix-ups show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (0 if arch == "gemma3" else 1))
    return config, model


def _write_gguf(path: Path, arch: str, config: Any, state: dict[str, torch.Tensor],
                dtypes: dict[str, Q] | None = None,
                blocks: dict[str, tuple[Q, np.ndarray]] | None = None) -> None:
    """Write HF weights the way llama.cpp's converter does (names, q/k permutation, Gemma's +1 norms).
    `blocks` gives some tensors as ready-made blocks (uint8 [rows, bytes per row]) of a type
    gguf-py cannot quantize to (Q2_K, ...), in place of the state's values."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", config.num_hidden_layers)
    w.add_uint32(f"{arch}.context_length", config.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", config.hidden_size)
    w.add_uint32(f"{arch}.feed_forward_length", config.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", config.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", config.num_key_value_heads)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    rope = config.rope_parameters.get("full_attention", config.rope_parameters)
    w.add_float32(f"{arch}.rope.freq_base", rope["rope_theta"])
    if arch in ("qwen3", "gemma3"):
        w.add_uint32(f"{arch}.attention.key_length", config.head_dim)
    if arch == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", config.sliding_window)
    w.add_uint32("tokenizer.ggml.bos_token_id", config.bos_token_id)
    w.add_uint32("tokenizer.ggml.eos_token_id", config.eos_token_id)
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in hf_name:
            data = _llamacpp_permute(data, config.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            data = _llamacpp_permute(data, config.num_key_value_heads)
        elif arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + 1
        qtype = (dtypes or {}).get(hf_name, Q.F32)
        if hf_name in (blocks or {}):
            qtype, raw = blocks[hf_name]
            w.add_tensor(_gguf_name(hf_name, arch), raw, raw_dtype=qtype)
        elif qtype == Q.F32:
            w.add_tensor(_gguf_name(hf_name, arch), data)
        else:
            w.add_tensor(_gguf_name(hf_name, arch), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch,tie", [("llama", True), ("qwen2", False), ("qwen3", True), ("gemma3", True)])
def test_round_trip_tiny_model(tmp_path: Path, arch: str, tie: bool) -> None:
    config, model = _tiny(arch, tie)
    state = model.state_dict()
    path = tmp_path / f"{arch}.gguf"
    _write_gguf(path, arch, config, state)

    loaded = load_gguf_config(path)
    assert type(loaded) is type(config)
    fields = [f for f in KEY_FIELDS if f not in ("rms_norm_eps", "pad_token_id")]
    if arch == "gemma3":
        fields += ["sliding_window", "layer_types", "query_pre_attn_scalar"]
    for field in fields:
        assert getattr(loaded, field) == getattr(config, field), field
    assert loaded.rms_norm_eps == pytest.approx(config.rms_norm_eps)  # stored as float32

    ours = dict(iter_gguf_tensors(path, loaded))
    expected = {k: v for k, v in state.items() if not (tie and k == "lm_head.weight")}
    assert set(ours) == set(expected)
    if arch == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in ours and "lm_head.weight" in ours
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0, msg=name)

    # and the model built from our config, with our tensors, computes what the original does
    import transformers
    rebuilt = transformers.AutoModelForCausalLM.from_config(loaded).float().eval()
    missing, unexpected = rebuilt.load_state_dict(ours, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tie else set())
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def _random_blocks(qtype: Q, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random quantized blocks with finite, small f16 scales (random bytes there could be inf/NaN)."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scale_offsets = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,)}[qtype]
    for off in scale_offsets:
        blocks[:, off:off + 2] = rng.uniform(-0.05, 0.05, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    return blocks


def test_every_dequantizer_matches_gguf_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 512)).astype(np.float32)
    arrays: dict[str, tuple[np.ndarray, Q]] = {}
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16):
        arrays[f"t_{qtype.name}"] = (gguf.quants.quantize(data, qtype), qtype)
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K):
        arrays[f"t_{qtype.name}"] = (_random_blocks(qtype, 16, rng).reshape(8, -1), qtype)
    arrays["t_F16"] = (data.astype(np.float16), Q.F16)
    path = tmp_path / "quants.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (arr, qtype) in arrays.items():
        w.add_tensor(name, arr, raw_dtype=None if qtype == Q.F16 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    gf = read_gguf(path)
    for name, (arr, qtype) in arrays.items():
        info = gf.tensors[name]
        assert info.ggml_type == qtype
        expected = gguf.quants.dequantize(arr, qtype).reshape(8, 512)
        ours = dequantize_tensor(gf, info)
        assert ours.dtype == torch.float32 and ours.shape == (8, 512), name
        np.testing.assert_array_equal(ours.numpy(), expected, err_msg=name)
        if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16, Q.F16):  # sanity: close to the input
            assert np.abs(ours.numpy() - data).max() < 0.5, name


def test_real_tensors_match_gguf_reference(bundled_path: Callable[[str], Path]) -> None:
    """The torch dequantizers on one real tensor of each type the two bundled files use."""
    for name in ("smollm2", "gemma3"):
        gf = read_gguf(bundled_path(name))
        seen: set[int] = set()
        for info in gf.tensors.values():
            if info.ggml_type in seen or info.name == "token_embd.weight":  # skip the 100M+ element one
                continue
            seen.add(info.ggml_type)
            raw = np.fromfile(gf.path, dtype=np.uint8, count=info.nbytes, offset=info.start)
            expected = gguf.quants.dequantize(raw.reshape(info.shape[0], -1), Q(info.ggml_type))
            np.testing.assert_array_equal(dequantize_tensor(gf, info).numpy(), expected.reshape(info.shape),
                                          err_msg=info.name)
        assert {Q(t).name for t in seen} >= ({"Q4_1", "F32"} if name == "smollm2" else
                                            {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"})


def _write_minimal(path: Path, arch: str, tensor_type: Q = Q.F32) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("embedding_length", 32), ("feed_forward_length", 64),
                       ("attention.head_count", 2), ("context_length", 128)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    _, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    if tensor_type == Q.F32:
        w.add_tensor("blk.0.attn_q.weight", np.zeros((32, 32), dtype=np.float32))
    else:
        w.add_tensor("blk.0.attn_q.weight", np.zeros((32, type_size), dtype=np.uint8), raw_dtype=tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unsupported_quant_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "iq4.gguf"
    _write_minimal(path, "llama", Q.IQ4_NL)
    config = load_gguf_config(path)
    with pytest.raises(ValueError, match=r"IQ4_NL") as err:
        list(iter_gguf_tensors(path, config))
    assert "blk.0.attn_q.weight" in str(err.value) and "Q4_K" in str(err.value)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    _write_minimal(path, "mamba")
    with pytest.raises(ValueError, match=r"mamba") as err:
        load_gguf_config(path)
    assert all(a in str(err.value) for a in ("llama", "qwen2", "qwen3", "gemma3"))


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF"):
        load_gguf_config(path)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") * 2 + b"\x01")
    with pytest.raises(ValueError, match="not a valid GGUF"):
        load_gguf_config(truncated)
