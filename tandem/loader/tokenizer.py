"""Tokenizer loading (transformers' tokenizers; GGUF vocabularies through our GGUF loader)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.model_config import ModelConfig


@functools.lru_cache(maxsize=8)
def _load(path: str, revision: str | None) -> Any:
    if path.endswith(".gguf"):
        from tandem.loader.gguf_loader import load_gguf_tokenizer
        return load_gguf_tokenizer(path)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, revision=revision)


def load_tokenizer(model_config: ModelConfig) -> Any:
    """The tokenizer for a model config; cached, since the draft check and the engine share it."""
    return _load(model_config.tokenizer, model_config.revision
                 if model_config.tokenizer == model_config.model else None)
