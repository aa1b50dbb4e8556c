"""Read a model's transformers config from a Hugging Face directory or a GGUF file."""

from __future__ import annotations

from typing import Any

from tandem.loader.model_source import ModelSource


def load_hf_config(source: ModelSource) -> Any:
    if source.gguf_file is not None:
        from tandem.loader.gguf_loader import load_gguf_config
        return load_gguf_config(source.gguf_file)
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(str(source.model_dir))
    # Multimodal wrappers (e.g. Gemma 3 4B) keep the language model under text_config; it is
    # served as text (models/gemma3.py Gemma3TextOnly maps the weights' names).
    text = getattr(config, "text_config", None)
    if text is not None and getattr(config, "model_type", "") == "gemma3":
        text.architectures = ["Gemma3ForConditionalGeneration"]
        return text
    return config
