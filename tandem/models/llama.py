"""Llama-family decoder (LlamaForCausalLM); Qwen2 and Qwen3 reuse it with small switches.

Qwen2 adds a bias to the q/k/v projections; Qwen3 drops it and RMS-normalises q and k per head.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from tandem.layers.activation import get_act_and_mul
from tandem.layers.attention import Attention
from tandem.layers.embedding import Embedding, LMHead
from tandem.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import RotaryEmbedding, apply_rotary, rope_parameters
from tandem.models.weights import load_weights

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, signed sin), each [T, 1, head_dim]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, self.num_heads,
                                          self.num_kv_heads,
                                          bias=qkv_bias or getattr(cfg, "attention_bias", False))
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(self.num_heads * self.head_dim * self.qkv_proj.tp,
                                        cfg.hidden_size, bias=getattr(cfg, "attention_bias", False))
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim,
                              self.head_dim ** -0.5)

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        h, hkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(t, h + 2 * hkv, self.head_dim)  # [T, H + 2 Hkv, D]
        v = qkv[:, h + hkv:]
        if self.q_norm is None:
            qk = apply_rotary(qkv[:, :h + hkv], rope)  # q and k heads rotated in one pass
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = apply_rotary(self.q_norm(qkv[:, :h]), rope)  # [T, H, D]
            k = apply_rotary(self.k_norm(qkv[:, h:h + hkv]), rope)
        return self.o_proj(self.attn(q, k, v))


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)
        self.act = get_act_and_mul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, qkv_bias, qk_norm)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            getattr(cfg, "mlp_bias", False))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(rope, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, qkv_bias, qk_norm)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.rotary = RotaryEmbedding(head_dim, rope_parameters(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary(positions)
        for layer in self.layers:
            x = layer(rope, x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, self.qkv_bias, self.qk_norm)
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
