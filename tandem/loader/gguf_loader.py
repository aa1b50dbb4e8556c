"""GGUF (llama.cpp's single-file format) -> a transformers config, float32 tensors under the Hugging Face
parameter names, and a tokenizer.

The header is read by `gguf_reader`, tensors are dequantized by `gguf_dequant`; this module maps both to
what the engine expects (config fields, parameter names, row order, Gemma's norm offsets).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterator

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import PretrainedConfig, PreTrainedTokenizerFast

from tandem.loader.gguf_dequant import (SUPPORTED_GGML_TYPES, dequantize_tensor, one_thread,  # noqa: F401
                                        raw_tensor)
from tandem.loader.gguf_archs import extra_config
from tandem.loader.gguf_reader import GGUFFile, GGUFTensorInfo, read_gguf  # noqa: F401
from tandem.layers.quantized import RawQuant

logger = logging.getLogger("tandem.loader")

__all__ = ["load_gguf_config", "iter_gguf_tensors", "load_gguf_tokenizer", "read_gguf",
           "dequantize_tensor", "GGUFFile", "GGUFTensorInfo", "SUPPORTED_GGML_TYPES"]

# general.architecture -> (config class name in transformers, HF architecture name)
_ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
}
_MODEL_TYPE_TO_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
                       "qwen3_moe": "qwen3moe", "phi3": "phi3", "gemma2": "gemma2", "olmo2": "olmo2",
                       "granite": "granite"}

# ---------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------

def _check_arch(arch: str, path: str | Path) -> None:
    if arch not in _ARCHS:
        raise ValueError(f"GGUF file {path} has architecture {arch!r}, which tandem does not support "
                         f"(supported: {', '.join(sorted(_ARCHS))})")


def load_gguf_config(path: str | Path) -> PretrainedConfig:
    """The transformers config the original Hugging Face checkpoint would have, rebuilt from GGUF metadata."""
    import transformers

    gf = read_gguf(path)
    arch = gf.architecture
    _check_arch(arch, path)
    config_cls_name, hf_arch = _ARCHS[arch]
    heads = int(gf.get("attention.head_count"))
    hidden = int(gf.get("embedding_length"))
    q_info = gf.tensors.get("blk.0.attn_q.weight")
    head_dim = gf.get("attention.key_length") or (q_info.shape[0] // heads if q_info else hidden // heads)
    vocab = gf.get("vocab_size") or gf.tensors["token_embd.weight"].shape[0]
    md = gf.metadata
    kwargs: dict[str, Any] = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gf.get("feed_forward_length") or gf.get("expert_feed_forward_length")),
        num_hidden_layers=int(gf.get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gf.get("attention.head_count_kv", heads)),
        head_dim=int(head_dim),
        rms_norm_eps=float(gf.get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(gf.get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in gf.tensors,
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=md.get("tokenizer.ggml.padding_token_id"),
        architectures=[hf_arch],
    )
    rope_theta = float(gf.get("rope.freq_base", 10000.0))
    scaling = _rope_scaling(gf)
    if arch == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(gf.get("rope.freq_base_swa", 10000.0))}
        full = {"rope_type": "default", "rope_theta": rope_theta, **scaling}
        kwargs["rope_parameters"] = {"sliding_attention": local, "full_attention": full}
        if gf.get("attention.sliding_window") is not None:
            kwargs["sliding_window"] = int(gf.get("attention.sliding_window"))
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B model (62 layers), which uses
        # hidden/heads; transformers calls that number query_pre_attn_scalar.
        kwargs["query_pre_attn_scalar"] = hidden // heads if kwargs["num_hidden_layers"] == 62 else head_dim
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if gf.get(key) is not None:
                kwargs[key] = float(gf.get(key))
    else:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta, **scaling}
        extra_config(arch, gf, kwargs)
    if arch == "qwen3moe":
        kwargs.update(_moe_fields(gf))
    # Gemma3TextConfig's default layer_types (5 sliding layers, then a global one) are what llama.cpp
    # assumes too: the GGUF has no key for the pattern.
    return getattr(transformers, config_cls_name)(**kwargs)


def _moe_fields(gf: GGUFFile) -> dict[str, Any]:
    """llama.cpp's qwen3moe: every layer sparse, softmax router, top-k weights renormalised
    (build_moe_ffn's norm_w is always on for this architecture)."""
    fields = {"num_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
              "moe_intermediate_size": "expert_feed_forward_length"}
    out: dict[str, Any] = {}
    for field, key in fields.items():
        if gf.get(key) is None:
            raise ValueError(f"GGUF file {gf.path} lacks {gf.architecture}.{key} (the config's "
                             f"{field}), which a mixture-of-experts model needs")
        value = gf.get(key)
        if isinstance(value, (list, tuple)):  # a per-layer array (llama.cpp allows one)
            if len(set(value)) != 1:
                raise ValueError(f"GGUF file {gf.path} has {gf.architecture}.{key} = {value}: "
                                 "experts of different sizes per layer are not supported")
            value = value[0]
        out[field] = int(value)
    return {**out, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _rope_scaling(gf: GGUFFile) -> dict[str, Any]:
    kind = gf.get("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(gf.get("rope.scaling.factor"))}
    logger.warning("%s: rope scaling %r is not read from GGUF metadata; using unscaled rope",
                   gf.path.name, kind)
    return {}


# ---------------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------------

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
}
# Mixture-of-experts tensors, all experts stacked in one 3-D tensor [experts, rows, cols]: each
# expert's slice goes to its own HF name (model.layers.N.mlp.experts.E.<part>).
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# Gemma 3 has four norms per layer ("sandwich" norms around attention and MLP).
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"}
# Gemma 2 names its norms as Gemma 3 does; OLMo 2 has only the two after each sublayer; Phi-3
# keeps its fused projections (models/phi3.py splits them).
_LAYER_TABLES = {
    "gemma2": _GEMMA3_LAYER_NAMES, "gemma3": _GEMMA3_LAYER_NAMES,
    "olmo2": {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_UNIT_OFFSET_NORMS = ("gemma2", "gemma3")  # stored as (1 + w) by llama.cpp
_PERMUTED_QK = ("llama", "granite")  # converted by LlamaModel, which permutes q/k rows
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# derived from the config by llama.cpp (HF recomputes them), or read into the config (Phi-3)
_IGNORED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _hf_name(gguf_name: str, arch: str) -> str | None:
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m:
        table = _LAYER_TABLES.get(arch, _LAYER_NAMES)
        part = table.get(m.group(2))
        return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    stem, _, suffix = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{suffix}" if stem in _GLOBAL_NAMES else None


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time q/k row reordering (HF's rotate-half rope layout -> ggml's
    interleaved pairs): per head, rows (0, d/2, 1, d/2+1, ...) in the file go back to (0, 1, ..., d-1)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def iter_gguf_tensors(path: str | Path, config: PretrainedConfig,
                      keep_quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | RawQuant]]:
    """(HF parameter name, tensor) for every weight of the file, shaped as the HF model's state dict:
    float32, or with `keep_quantized` the file's own blocks (`RawQuant`) for every 2-D tensor that is
    not float32 (the model's layers keep them, or dequantize them, in layers/quantized.py)."""
    gf = read_gguf(path)
    arch = _MODEL_TYPE_TO_ARCH.get(config.model_type, gf.architecture)
    _check_arch(gf.architecture, path)
    if arch != gf.architecture:
        raise ValueError(f"config is for {config.model_type!r} but {path} holds a {gf.architecture!r} model")
    _check_extent(gf)
    for info in gf.tensors.values():
        m = _BLOCK_RE.fullmatch(info.name)
        if m and m.group(2) in _EXPERT_NAMES and len(info.shape) == 3:
            yield from _expert_tensors(gf, info, int(m.group(1)), _EXPERT_NAMES[m.group(2)],
                                       keep_quantized)
            continue
        name = _hf_name(info.name, arch)
        if name is None:
            if info.name not in _IGNORED:
                logger.warning("%s: skipping unrecognised GGUF tensor %s", gf.path.name, info.name)
            continue
        heads = None
        if arch in _PERMUTED_QK and ".self_attn.q_proj." in name:
            heads = config.num_attention_heads
        elif arch in _PERMUTED_QK and ".self_attn.k_proj." in name:
            heads = config.num_key_value_heads
        if keep_quantized and len(info.shape) == 2 and info.ggml_type != GGMLQuantizationType.F32:
            _check_type(gf, info)
            raw = RawQuant(info.ggml_type, raw_tensor(gf, info), info.shape[1],
                           GGMLQuantizationType(info.ggml_type).name, mapped=True)
            if heads is not None:  # rows are independent in every block format
                order = _unpermute_rows(torch.arange(info.shape[0]), heads)
                raw = raw.take_rows(order)
            yield name, raw
            continue
        with one_thread():  # not held across the yield: the caller's own work keeps torch's threads
            tensor = dequantize_tensor(gf, info)
            if heads is not None:
                tensor = _unpermute_rows(tensor, heads)
            elif arch in _UNIT_OFFSET_NORMS and name.endswith("norm.weight"):
                # llama.cpp stores Gemma's RMSNorm weights as (1 + w); HF's Gemma3RMSNorm adds the 1 itself
                tensor -= 1.0
        yield name, tensor


def _expert_tensors(gf: GGUFFile, info: GGUFTensorInfo, layer: int, part: str,
                    keep_quantized: bool) -> Iterator[tuple[str, torch.Tensor | RawQuant]]:
    """One stacked expert tensor [E, rows, cols] as E (HF name, [rows, cols]) pairs: slices of
    the file's blocks (each expert's rows are whole rows of blocks), or of its float32 values."""
    experts, rows, cols = info.shape
    names = [f"model.layers.{layer}.mlp.experts.{e}.{part}.weight" for e in range(experts)]
    if keep_quantized and info.ggml_type != GGMLQuantizationType.F32:
        _check_type(gf, info)
        raw = RawQuant(info.ggml_type, raw_tensor(gf, info), cols,  # [E * rows] rows of blocks
                       GGMLQuantizationType(info.ggml_type).name, mapped=True)
        for e, name in enumerate(names):
            yield name, raw.narrow(e * rows, rows)
        return
    with one_thread():
        stacked = dequantize_tensor(gf, info)  # [E, rows, cols]
    for e, name in enumerate(names):
        yield name, stacked[e]


def _check_type(gf: GGUFFile, info: GGUFTensorInfo) -> None:
    if info.ggml_type not in GGML_QUANT_SIZES:
        raise ValueError(f"tensor {info.name!r} in {gf.path.name} has quantization type "
                         f"{info.ggml_type}, which tandem cannot read (supported: "
                         f"{', '.join(SUPPORTED_GGML_TYPES)})")


def _check_extent(gf: GGUFFile) -> None:
    """A truncated file (an interrupted download) is an error naming it, not a crash on a memory
    map that reads past the end."""
    size = gf.path.stat().st_size
    for info in gf.tensors.values():
        if info.start + info.nbytes > size:
            raise ValueError(f"{gf.path} is truncated: tensor {info.name!r} ends at byte "
                             f"{info.start + info.nbytes}, but the file has {size} bytes. "
                             "Download it again.")


# ---------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------

def load_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The file's tokenizer (with its chat template, if the file has one) as a fast HF tokenizer."""
    path = Path(path)
    # The tokenizer class itself, not AutoTokenizer: AutoTokenizer first rebuilds the model config through
    # gguf.GGUFReader, which takes ~10 s on Gemma's vocabulary. The encodings are the same.
    return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
