"""The model's configuration: what was asked for, where it resolved to, dtype and length.

Below `tandem/config.py` (which builds the engine's whole configuration from it) so that the
speculative config and the tokenizer loader, which `config.py` uses, can name a `ModelConfig`
without importing the engine's configuration back.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from tandem.loader.hf_config import load_hf_config
from tandem.loader.model_source import resolve_model

logger = logging.getLogger("tandem")
# vLLM's switch for a max_model_len past the model's own (positions it was never trained on)
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"

_DTYPES = {
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float32, "float32": torch.float32,
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda', got {device!r}.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available; "
                         "use device='cpu' or 'auto'.")
    return torch.device(device)


def resolve_dtype(dtype: Union[str, torch.dtype], hf_config: Any, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32  # CPU matmuls in bf16/fp16 are slow without AMX; keep exact fp32
        cfg = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        cfg = _DTYPES.get(cfg, cfg) if isinstance(cfg, str) else cfg
        return torch.bfloat16 if cfg in (None, torch.float32) else cfg
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}.")
    return _DTYPES[dtype]


# "auto" detects safetensors or GGUF; "dummy" initialises random weights (vLLM's, benchmarks).
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


@dataclass(frozen=True)
class ModelConfig:
    model: str                       # what the user asked for (name or path)
    model_dir: str                   # resolved directory on disk
    gguf_file: Optional[str]         # set when the weights come from a GGUF file
    tokenizer: str                   # tokenizer name or path
    hf_config: Any                   # transformers PretrainedConfig
    dtype: torch.dtype
    max_model_len: int
    seed: int
    revision: Optional[str] = None
    load_format: str = "auto"        # "dummy": random weights (benchmarks), no weight files
    quantization: Optional[str] = None  # weights kept quantized: gguf, q8_0, q4_0, q4_k (None: float)

    @property
    def architecture(self) -> str:
        return (getattr(self.hf_config, "architectures", None) or ["?"])[0]

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)

    @staticmethod
    def create(model: str, tokenizer: Optional[str], dtype: Union[str, torch.dtype],
               max_model_len: Optional[int], seed: int, revision: Optional[str],
               device: torch.device, field_prefix: str = "", load_format: str = "auto"
               ) -> ModelConfig:
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {list(LOAD_FORMATS)}, got "
                             f"{load_format!r} (formats are detected from the files).")
        source = resolve_model(model, revision=revision, need_weights=load_format != "dummy")
        hf_config = load_hf_config(source)
        derived = model_max_len(hf_config)
        if max_model_len is None:
            max_model_len = derived
        elif max_model_len < 1:
            raise ValueError(f"{field_prefix}max_model_len must be at least 1, got {max_model_len}.")
        elif max_model_len > derived:
            if os.environ.get(ALLOW_LONG_ENV, "0").strip().lower() not in ("1", "true"):
                raise ValueError(
                    f"User-specified {field_prefix}max_model_len ({max_model_len}) is greater "
                    f"than the derived max_model_len (max_position_embeddings={derived} in the "
                    f"model's config). Use max_model_len <= {derived}, or set the env var "
                    f"{ALLOW_LONG_ENV}=1 to allow it (positions past the model's own give "
                    f"untrained attention: for measuring, not for quality).")
            logger.warning("%smax_model_len %d is past the model's %d (%s=1): positions beyond "
                           "it were never trained", field_prefix, max_model_len, derived,
                           ALLOW_LONG_ENV)
        gguf = str(source.gguf_file) if source.gguf_file else None
        if tokenizer is not None:  # a Hub id resolves like a model: cache, then bundled copy
            tok = resolve_model(tokenizer, revision=None)
            tokenizer = str(tok.gguf_file) if tok.gguf_file else str(tok.model_dir)
        return ModelConfig(model=model, model_dir=str(source.model_dir), gguf_file=gguf,
                           tokenizer=tokenizer or (gguf or str(source.model_dir)),
                           hf_config=hf_config, dtype=resolve_dtype(dtype, hf_config, device),
                           max_model_len=int(max_model_len), seed=seed, revision=revision,
                           load_format=load_format)


def model_max_len(hf_config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
