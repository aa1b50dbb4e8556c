"""GraniteForCausalLM: the Llama decoder with four multipliers: embeddings times
embedding_multiplier, each sublayer's output times residual_multiplier before its residual add,
attention scores scaled by attention_multiplier (instead of 1/sqrt(head_dim)), and logits divided
by logits_scaling."""

from __future__ import annotations

from typing import Any, Optional

import torch

from tandem.layers.rotary import Rope
from tandem.models.config_fields import require
from tandem.models.llama import LlamaDecoderLayer, LlamaForCausalLM

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
               "logits_scaling")


class GraniteDecoderLayer(LlamaDecoderLayer):
    def __init__(self, cfg: Any, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__(cfg, qkv_bias, qk_norm)
        self.residual_multiplier = float(cfg.residual_multiplier)
        self.self_attn.attn.scale = float(cfg.attention_multiplier)

    def forward(self, rope: Rope, x: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """As Llama's (each add fused with the norm after it), each sublayer's output scaled
        first: x is the previous layer's scaled MLP output."""
        m = self.residual_multiplier
        h, residual = self.input_layernorm.add(x, residual)
        h, residual = self.post_attention_layernorm.add(self.self_attn(rope, h) * m, residual)
        return self.mlp(h) * m, residual


class GraniteForCausalLM(LlamaForCausalLM):
    decoder_layer = GraniteDecoderLayer

    def __init__(self, cfg: Any) -> None:
        require(cfg, "GraniteForCausalLM", *MULTIPLIERS)
        super().__init__(cfg)
        self.model.embed_tokens.scale = float(cfg.embedding_multiplier)
        self.logits_scaling = float(cfg.logits_scaling)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.logits_scaling  # [N, vocab]
