"""What GGUF metadata says about Phi-3, Gemma 2, OLMo 2 and Granite beyond the common
hyperparameters, as transformers config fields (as llama.cpp's loader reads the same keys)."""

from __future__ import annotations

from typing import Any

from tandem.loader.gguf_dequant import dequantize_tensor
from tandem.loader.gguf_reader import GGUFFile


def extra_config(arch: str, gf: GGUFFile, kwargs: dict[str, Any]) -> None:
    """Adds arch-specific fields to `kwargs` (the common ones and rope_parameters already set)."""
    if arch == "phi3":
        _phi3(gf, kwargs)
    elif arch == "gemma2":
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B model (46 layers),
        # which uses hidden / heads: transformers calls that number query_pre_attn_scalar.
        big = kwargs["num_hidden_layers"] == 46
        kwargs["query_pre_attn_scalar"] = (kwargs["hidden_size"] // kwargs["num_attention_heads"]
                                           if big else kwargs["head_dim"])
        kwargs["sliding_window"] = int(gf.get("attention.sliding_window", 4096))
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            kwargs[key] = float(gf.get(key)) if gf.get(key) is not None else None
    elif arch == "granite":
        for key, field in (("attention.scale", "attention_multiplier"),
                           ("embedding_scale", "embedding_multiplier"),
                           ("residual_scale", "residual_multiplier"),
                           ("logit_scale", "logits_scaling")):
            kwargs[field] = float(gf.get(key, 1.0))


def _phi3(gf: GGUFFile, kwargs: dict[str, Any]) -> None:
    """Partial rotary from rope.dimension_count; LongRoPE from the factor tensors the converter
    writes (rope_factors_long/short), its original length and attention factor from metadata;
    a sliding window of 0 means none (Phi-4)."""
    rope = kwargs["rope_parameters"]
    rotary = gf.get("rope.dimension_count")
    if rotary is not None and int(rotary) != kwargs["head_dim"]:
        rope["partial_rotary_factor"] = int(rotary) / kwargs["head_dim"]
    window = gf.get("attention.sliding_window")
    kwargs["sliding_window"] = int(window) if window else None
    if "rope_factors_long.weight" in gf.tensors:
        original = int(gf.get("rope.scaling.original_context_length"))
        factors = {f"{kind}_factor": dequantize_tensor(
            gf, gf.tensors[f"rope_factors_{kind}.weight"]).tolist() for kind in ("long", "short")}
        rope.update(rope_type="longrope", original_max_position_embeddings=original, **factors)
        if gf.get("rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(gf.get("rope.scaling.attn_factor"))
        kwargs["original_max_position_embeddings"] = original
