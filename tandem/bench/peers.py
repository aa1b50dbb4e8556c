"""Optional peers measured in the same run: transformers' `generate` (plain, and assisted
generation with the same draft). Used only when transformers can load the model; never a
dependency of the engine."""

from __future__ import annotations

import functools
import time
from typing import Any, Optional


@functools.lru_cache(maxsize=4)  # loaded once per run, however many rounds time it
def _load(model: str, dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.loader.model_source import resolve_model
    src = resolve_model(model)
    kwargs = {"gguf_file": src.gguf_file.name} if src.gguf_file is not None else {}
    tok = AutoTokenizer.from_pretrained(str(src.model_dir), **kwargs)
    m = AutoModelForCausalLM.from_pretrained(str(src.model_dir), dtype=dtype, **kwargs).eval()
    return tok, m


def transformers_decode(model: str, prompts: list[str], max_tokens: int,
                        draft: Optional[str] = None) -> dict[str, float]:
    """Single-stream greedy tokens/s of `generate` (assisted by `draft` if given)."""
    import torch
    tok, target = _load(model, torch.float32)
    assistant = _load(draft, torch.float32)[1] if draft else None
    extra = {"assistant_model": assistant} if assistant is not None else {}
    total_tokens, total_time = 0, 0.0
    for i, text in enumerate([prompts[0]] + prompts):  # the first run warms up
        ids = tok(text, return_tensors="pt")
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(**ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                  do_sample=False, pad_token_id=tok.eos_token_id, **extra)
        if i > 0:
            total_time += time.perf_counter() - t0
            total_tokens += out.shape[1] - ids.input_ids.shape[1]
    return {"tokens_per_s": total_tokens / total_time}
