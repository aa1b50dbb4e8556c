"""Gemma2ForCausalLM: Gemma 3's layer shape (four (1 + w) norms per layer, sqrt(hidden)-scaled
embeddings, GELU-tanh MLP, query_pre_attn_scalar) without q/k norms, with one rope base,
sliding-window layers alternating with global ones, and soft-capped attention scores and logits."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandem.layers.embedding import Embedding
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import RotaryEmbedding, rope_parameters
from tandem.models.config_fields import require
from tandem.models.gemma3 import SLIDING, Gemma3DecoderLayer, Gemma3ForCausalLM

FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "intermediate_size", "rms_norm_eps", "query_pre_attn_scalar",
          "sliding_window", "vocab_size")


def layer_types(cfg: Any) -> list[str]:
    """Gemma 2 alternates: even layers slide, odd layers see everything (transformers' default)."""
    types = getattr(cfg, "layer_types", None)
    if types:
        return list(types)
    return [SLIDING if i % 2 == 0 else "full_attention" for i in range(cfg.num_hidden_layers)]


class Gemma2Model(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, scale=cfg.hidden_size**0.5)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, t == SLIDING, qk_norm=False)
                                    for t in layer_types(cfg))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.rotary = RotaryEmbedding(cfg.head_dim, rope_parameters(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary(positions)
        for layer in self.layers:
            x = layer(rope, x)
        return self.norm(x)


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """compute_logits (final soft-capping), attention_layers and load_weights are Gemma 3's."""

    def __init__(self, cfg: Any) -> None:
        require(cfg, "Gemma2ForCausalLM", *FIELDS)
        super().__init__(cfg, model=Gemma2Model(cfg))
