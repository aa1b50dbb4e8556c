"""Stream (name, tensor) pairs from a model's files, whatever their format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch


def iter_safetensors(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors weights found in {root}.")
    for name in files:
        with safe_open(str(root / name), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def iter_weights(model_dir: str, gguf_file: str | None, hf_config: Any,
                 keep_quantized: bool = False) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) pairs; with `keep_quantized`, a GGUF file's quantized tensors come as
    their blocks (layers/quantized.RawQuant)."""
    if gguf_file is not None:
        from tandem.loader.gguf_loader import iter_gguf_tensors
        return iter_gguf_tensors(gguf_file, hf_config, keep_quantized)
    return iter_safetensors(model_dir)
