"""Which tensor-parallel sizes a model's shapes allow, with an error that names them."""

from __future__ import annotations

from typing import Any


def allowed_tp_sizes(hf_config: Any, limit: int = 64) -> list[int]:
    heads = int(hf_config.num_attention_heads)
    kv = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    inter = int(getattr(hf_config, "intermediate_size", 0) or 0)
    expert = int(getattr(hf_config, "moe_intermediate_size", 0) or 0)  # every expert splits
    return [d for d in range(1, min(limit, heads) + 1)
            if heads % d == 0 and (kv % d == 0 or d % kv == 0) and inter % d == 0
            and expert % d == 0]


def check_tp_size(hf_config: Any, size: int, field: str, model: str) -> None:
    """Heads split evenly across ranks; KV heads split too, or replicate when there are fewer
    of them than ranks; the MLP's intermediate size splits evenly."""
    allowed = allowed_tp_sizes(hf_config, limit=max(64, size))
    if size in allowed:
        return
    heads = int(hf_config.num_attention_heads)
    kv = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    inter = int(getattr(hf_config, "intermediate_size", 0) or 0)
    expert = int(getattr(hf_config, "moe_intermediate_size", 0) or 0)
    experts = f", and each expert's intermediate size {expert}" if expert else ""
    raise ValueError(
        f"{field}={size} does not fit {model}: its {heads} attention heads must divide evenly "
        f"by {size}, its {kv} KV heads must divide by {size} (or {size} by them, to replicate "
        f"them), and its intermediate size {inter}{experts} must divide by {size}. Allowed sizes: "
        f"{allowed}.")
