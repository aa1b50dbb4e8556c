"""Llama-family decoder (LlamaForCausalLM); Qwen2 and Qwen3 reuse it with small switches.

Qwen2 adds a bias to the q/k/v projections; Qwen3 drops it and RMS-normalises q and k per head.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from tandem.layers.activation import get_act_and_mul
from tandem.layers.attention import Attention
from tandem.layers.embedding import Embedding
from tandem.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from tandem.models.causal_lm import CausalLM
from tandem.models.llama_fused import fused_stack


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
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        return self.o_proj(self.attn.forward_qkv(qkv, rope, self.q_norm, self.k_norm))


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

    def forward(self, rope: Rope, x: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, residual: the stream before it (None at layer 0).
        Returns this layer's MLP output and the stream before it: each residual add is fused
        with the norm after it (the final norm takes the last one)."""
        h, residual = self.input_layernorm.add(x, residual)
        h, residual = self.post_attention_layernorm.add(self.self_attn(rope, h), residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, qk_norm: bool,
                 layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer,
                 rotary: Optional[RotaryEmbedding] = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_cls(cfg, qkv_bias, qk_norm)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.rotary = rotary or RotaryEmbedding(head_dim, rope_parameters(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary(positions)
        fused = fused_stack(self, x, rope)  # float32 or quantized steps on the CPU: one C call
        if fused is not None:
            return fused
        residual: Optional[torch.Tensor] = None
        for layer in self.layers:
            x, residual = layer(rope, x, residual)
        return self.norm.add(x, residual)[0]


class LlamaForCausalLM(CausalLM):
    qkv_bias = False
    qk_norm = False
    decoder_layer: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, cfg: Any, rotary: Optional[RotaryEmbedding] = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, self.qkv_bias, self.qk_norm, self.decoder_layer, rotary)
        self.attach_lm_head()
