"""Phi3ForCausalLM: the Llama decoder with fused qkv_proj / gate_up_proj checkpoint tensors,
partial rotary (partial_rotary_factor, Phi-4-mini) and LongRoPE scaling (short/long factors).

LongRoPE: which factors apply is decided once, at load, as vLLM does: the long ones when the
engine's max_model_len exceeds original_max_position_embeddings. transformers switches per
forward pass (long once a sequence passes the original length, keeping the keys it cached
with the short ones); deciding once keeps a position's rotation independent of the batch and of
what was cached, which speculative verification needs. Both scale the rotated dimensions' cos
and sin by the attention factor (given, or sqrt(1 + ln(factor) / ln(original length))).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Iterator, Optional

import torch

from tandem.layers.quantized import RawQuant
from tandem.layers.rotary import RotaryEmbedding, partial_rotary_order, rope_parameters
from tandem.models.config_fields import require
from tandem.models.llama import LlamaForCausalLM
from tandem.models.weights import load_weights

logger = logging.getLogger("tandem")

FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "rms_norm_eps", "vocab_size")


def phi3_rotary(cfg: Any, head_dim: int, max_model_len: Optional[int]) -> RotaryEmbedding:
    params = rope_parameters(cfg)
    factor = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * float(factor or 1.0))
    if rotary_dim % 2 or (head_dim - rotary_dim) % 2:
        raise ValueError(f"partial_rotary_factor={factor} gives {rotary_dim} rotary dimensions "
                         f"of {head_dim}; both it and the rest must be even.")
    if params["rope_type"] == "su":  # the first Phi-3 128k configs' name for LongRoPE
        params["rope_type"] = "longrope"
    if params["rope_type"] != "longrope":
        return RotaryEmbedding(head_dim, params, rotary_dim)
    for key in ("short_factor", "long_factor"):
        if params.get(key) is None:
            raise ValueError(f"Phi3ForCausalLM with rope_type 'longrope' needs the config field "
                             f"rope_parameters.{key} (rope_scaling.{key} in older configs).")
    original = params.get("original_max_position_embeddings") or getattr(
        cfg, "original_max_position_embeddings", None)
    if original is None:
        raise ValueError("Phi3ForCausalLM with rope_type 'longrope' needs the config field "
                         "'original_max_position_embeddings'.")
    scale = params.get("factor") or cfg.max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    max_len = max_model_len or cfg.max_position_embeddings
    long = max_len > original
    logger.info("Phi-3 LongRoPE: %s factors (max_model_len %d %s original_max_position_embeddings"
                " %d), attention factor %.4f", "long" if long else "short", max_len,
                ">" if long else "<=", original, attention_factor)
    return RotaryEmbedding(head_dim, params, rotary_dim, float(attention_factor), long)


def _rows(t: torch.Tensor | RawQuant, start: int, length: int) -> torch.Tensor | RawQuant:
    return t.narrow(start, length) if isinstance(t, RawQuant) else t.narrow(0, start, length)


def _reorder(t: torch.Tensor | RawQuant, order: torch.Tensor) -> torch.Tensor | RawQuant:
    return t.take_rows(order) if isinstance(t, RawQuant) else t.index_select(0, order)


class Phi3ForCausalLM(LlamaForCausalLM):
    takes_max_model_len = True  # registry.build_model passes it: LongRoPE's choice of factors

    def __init__(self, cfg: Any, max_model_len: Optional[int] = None) -> None:
        require(cfg, "Phi3ForCausalLM", *FIELDS)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rotary = phi3_rotary(cfg, head_dim, max_model_len)
        super().__init__(cfg, rotary)
        self.head_dim = head_dim
        rotary_dim = self.head_dim - 2 * rotary.pad
        self.dim_order = (partial_rotary_order(self.head_dim, rotary_dim)
                          if rotary_dim < self.head_dim else None)
        # transformers masks every layer to the window when the config has one (Phi-3-mini-4k);
        # one no sequence can exceed (Phi-3.5-mini's 262144) is dropped, keeping the fused paths.
        window = getattr(cfg, "sliding_window", None)
        if window and window >= (max_model_len or cfg.max_position_embeddings):
            window = None
        for layer in self.model.layers:
            layer.self_attn.attn.sliding_window = window or None

    def _split(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Fused checkpoint tensors into the q/k/v and gate/up parts our layers load (each
        rank slicing its own), q and k rows in partial-rotary order."""
        cfg = self.config
        q = cfg.num_attention_heads * self.head_dim
        kv = cfg.num_key_value_heads * self.head_dim
        for name, t in weights:
            if ".qkv_proj." in name:
                parts = {"q_proj": (_rows(t, 0, q), cfg.num_attention_heads),
                         "k_proj": (_rows(t, q, kv), cfg.num_key_value_heads),
                         "v_proj": (_rows(t, q + kv, kv), None)}
                for part, (rows, heads) in parts.items():
                    if heads is not None and self.dim_order is not None:
                        order = (torch.arange(heads).unsqueeze(1) * self.head_dim
                                 + self.dim_order).view(-1)
                        rows = _reorder(rows, order)
                    yield name.replace("qkv_proj", part), rows
            elif ".gate_up_proj." in name:
                inter = cfg.intermediate_size
                yield name.replace("gate_up_proj", "gate_proj"), _rows(t, 0, inter)
                yield name.replace("gate_up_proj", "up_proj"), _rows(t, inter, inter)
            else:
                yield name, t

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, self._split(weights))
