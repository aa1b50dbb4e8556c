"""What every model class shares around its decoder stack: the LM head (tied to the embedding
where the config says), and the engine's interface (forward to hidden states, logits, the
attention layers whose caches the worker binds, weight loading)."""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from tandem.layers.attention import Attention
from tandem.layers.embedding import LMHead
from tandem.models.weights import load_weights


class CausalLM(nn.Module):
    """A subclass sets `self.config` and `self.model` (embed_tokens, layers with
    self_attn.attn), then calls `attach_lm_head`."""
    config: Any
    model: nn.Module

    def attach_lm_head(self) -> None:
        cfg = self.config
        tied = getattr(cfg, "tie_word_embeddings", False)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size,
                              self.model.embed_tokens if tied else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [N, vocab]

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, weights)
