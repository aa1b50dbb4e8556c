"""Sampling defaults from a model's generation_config.json (vLLM's `--generation-config`).

`auto` reads the model directory's file, `vllm` uses none, anything else is a folder holding one.
Only the sampling fields a request can also set are taken, and only those the file states; a
request's own values always win.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("tandem")

# generation_config.json key -> SamplingParams field
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def sampling_defaults(model_dir: str, mode: str) -> dict[str, Any]:
    if mode == "vllm":
        return {}
    folder = Path(model_dir) if mode == "auto" else Path(mode)
    path = folder / "generation_config.json"
    if not path.is_file():
        if mode != "auto":
            raise ValueError(f"--generation-config {mode}: no generation_config.json there; use "
                             "auto, vllm, or a folder that holds one.")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} cannot be read as JSON: {e}") from None
    defaults = {field: data[key] for key, field in FIELDS.items()
                if key in data and data[key] is not None}
    if data.get("do_sample") is False and "temperature" not in defaults:
        defaults["temperature"] = 0.0  # the model's authors ask for greedy decoding
    if defaults:
        logger.info("Default sampling parameters from %s: %s (requests override them; "
                    "--generation-config vllm turns them off)", path, defaults)
    return defaults
