"""Gemma3ForCausalLM (text): sliding-window layers with a local rope base, global layers with
another, q/k RMS norms, four norms per layer, (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

import torch
from torch import nn

from tandem.layers.attention import Attention
from tandem.layers.embedding import Embedding, LMHead
from tandem.layers.linear import QKVParallelLinear, RowParallelLinear
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from tandem.models.gemma3_fused import gemma_stack
from tandem.models.llama import GatedMLP
from tandem.models.weights import load_weights

logger = logging.getLogger("tandem")

SLIDING = "sliding_attention"
FULL = "full_attention"


def layer_types(cfg: Any) -> list[str]:
    types = getattr(cfg, "layer_types", None)
    if types:
        return list(types)
    pattern = getattr(cfg, "sliding_window_pattern", 6)
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(cfg.num_hidden_layers)]


class Gemma3Attention(nn.Module):
    """Gemma 3's attention; Gemma 2's without the q/k norms, with its scores soft-capped."""

    def __init__(self, cfg: Any, sliding: bool, qk_norm: bool = True) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads,
                                          bias=getattr(cfg, "attention_bias", False))
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size,
                                        bias=getattr(cfg, "attention_bias", False))
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, unit_offset=True) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, unit_offset=True) if qk_norm else None
        window: Optional[int] = cfg.sliding_window if sliding else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, cfg.head_dim,
                              cfg.query_pre_attn_scalar ** -0.5, sliding_window=window,
                              softcap=getattr(cfg, "attn_logit_softcapping", None))

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        return self.o_proj(self.attn.forward_qkv(qkv, rope, self.q_norm, self.k_norm))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: Any, sliding: bool, qk_norm: bool = True) -> None:
        super().__init__()
        self.sliding = sliding
        self.self_attn = Gemma3Attention(cfg, sliding, qk_norm)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size,
                            getattr(cfg, "hidden_activation", None) or "gelu_pytorch_tanh")
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(rope, self.input_layernorm(x)))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, scale=cfg.hidden_size**0.5)
        types = layer_types(cfg)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, t == SLIDING) for t in types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.rotary_global = RotaryEmbedding(cfg.head_dim, rope_parameters(cfg, FULL))
        self.rotary_local = RotaryEmbedding(cfg.head_dim, _local_rope(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope_global, rope_local = self.rotary_global(positions), self.rotary_local(positions)
        fused = gemma_stack(self, x, rope_local, rope_global)  # CPU steps: one C call
        if fused is not None:
            return fused
        for layer in self.layers:
            x = layer(rope_local if layer.sliding else rope_global, x)
        return self.norm(x)


def _local_rope(cfg: Any) -> dict:
    params = getattr(cfg, "rope_parameters", None)
    if params and SLIDING in params:
        return rope_parameters(cfg, SLIDING)
    return {"rope_type": "default", "rope_theta": getattr(cfg, "rope_local_base_freq", 10000.0)}


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, cfg: Any, model: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = model if model is not None else Gemma3Model(cfg)
        tied = getattr(cfg, "tie_word_embeddings", True)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size,
                              self.model.embed_tokens if tied else None)
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # [N, vocab]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, weights)


# Checkpoint name prefixes of Gemma3ForConditionalGeneration's language model: transformers < 4.52
# saved it as `language_model.model.*` and `language_model.lm_head.*`, later versions save
# `model.language_model.*` and `lm_head.*`.
_TEXT_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                  ("model.language_model.", "model."))
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                    "model.multi_modal_projector.")


class Gemma3TextOnly(Gemma3ForCausalLM):
    """A Gemma3ForConditionalGeneration checkpoint served as text: its language model (config
    under `text_config`, see loader/hf_config.py) is Gemma3ForCausalLM; the vision tower's and the
    projector's tensors are skipped, with one log line."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skipped = [0]

        def text_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(_VISION_PREFIXES):
                    skipped[0] += 1
                    continue
                for old, new in _TEXT_PREFIXES:
                    if name.startswith(old):
                        name = new + name[len(old):]
                        break
                yield name, tensor

        load_weights(self, text_weights())
        if skipped[0]:
            logger.info("Gemma3ForConditionalGeneration served as text: skipped %d vision tower "
                        "and projector tensors", skipped[0])
