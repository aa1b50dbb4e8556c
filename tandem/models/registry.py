"""Architecture name (config.json `architectures`) -> our model class, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch
from torch import nn

_MODELS = {
    "LlamaForCausalLM": ("tandem.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("tandem.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("tandem.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("tandem.models.qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("tandem.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Gemma3ForCausalLM": ("tandem.models.gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("tandem.models.gemma3", "Gemma3TextOnly"),
    "Phi3ForCausalLM": ("tandem.models.phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("tandem.models.gemma2", "Gemma2ForCausalLM"),
    "Olmo2ForCausalLM": ("tandem.models.olmo2", "Olmo2ForCausalLM"),
    "GraniteForCausalLM": ("tandem.models.granite", "GraniteForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def model_class(hf_config: Any) -> type[nn.Module]:
    archs = getattr(hf_config, "architectures", None) or []
    for arch in archs:
        if arch in _MODELS:
            module, name = _MODELS[arch]
            return getattr(importlib.import_module(module), name)
    raise ValueError(f"Model architectures {archs} are not supported. Supported architectures: "
                     f"{supported_architectures()}.")


def build_model(hf_config: Any, dtype: torch.dtype, device: torch.device, weights,
                max_model_len: Optional[int] = None) -> nn.Module:
    """Instantiate the architecture on `device` in `dtype` and load `weights` (name, tensor).
    max_model_len reaches the classes that ask for it (Phi-3's LongRoPE)."""
    cls = model_class(hf_config)
    extra = {"max_model_len": max_model_len} if getattr(cls, "takes_max_model_len", False) else {}
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(hf_config, **extra)
    finally:
        torch.set_default_dtype(prev)
    if weights is not None:  # None: the caller initialises them (load_format "dummy")
        model.load_weights(weights)
    return model.eval()
