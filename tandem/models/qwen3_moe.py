"""Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k norms, no
bias) with a mixture-of-experts MLP (layers/moe.py) in the sparse layers.

A layer is sparse where transformers makes it so: num_experts > 0, (index + 1) divisible by
decoder_sparse_step, and the index not in mlp_only_layers; the others keep a dense SwiGLU MLP
of intermediate_size. Qwen3-MoE has no shared experts. The fused whole-stack CPU call
(models/llama_fused.py) does not apply (its C stack has no router); the per-layer CPU kernels
(attention, norms, SiLU-and-mul, our matmul) do.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from tandem.layers.attention import Attention
from tandem.layers.embedding import Embedding
from tandem.layers.moe import SparseMoeBlock
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from tandem.models.causal_lm import CausalLM
from tandem.models.llama import GatedMLP, LlamaAttention

_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


def _field(cfg: Any, name: str) -> Any:
    value = getattr(cfg, name, None)
    if value is None:
        raise ValueError(f"Qwen3MoeForCausalLM needs config field {name!r}, which the model's "
                         "config does not have.")
    return value


def is_sparse_layer(cfg: Any, index: int) -> bool:
    """transformers' rule (Qwen3MoeDecoderLayer)."""
    return (index not in (getattr(cfg, "mlp_only_layers", None) or [])
            and cfg.num_experts > 0
            and (index + 1) % (getattr(cfg, "decoder_sparse_step", None) or 1) == 0)


def check_config(cfg: Any) -> None:
    for name in _MOE_FIELDS:
        _field(cfg, name)
    if not 0 < cfg.num_experts_per_tok <= max(cfg.num_experts, 1):
        raise ValueError(f"num_experts_per_tok={cfg.num_experts_per_tok} must be between 1 and "
                         f"num_experts={cfg.num_experts}.")
    if any(not is_sparse_layer(cfg, i) for i in range(cfg.num_hidden_layers)):
        _field(cfg, "intermediate_size")  # the dense layers' MLP


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, cfg: Any, index: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, qkv_bias=False, qk_norm=True)
        window = getattr(cfg, "sliding_window", None)  # set only with use_sliding_window
        if window:
            a = self.self_attn
            a.attn = Attention(a.num_heads, a.num_kv_heads, a.head_dim, a.head_dim ** -0.5,
                               sliding_window=window)
        self.mlp: nn.Module
        if is_sparse_layer(cfg, index):
            self.mlp = SparseMoeBlock(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                                      cfg.num_experts_per_tok,
                                      bool(getattr(cfg, "norm_topk_prob", False)), cfg.hidden_act)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope: Rope, x: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """As LlamaDecoderLayer: (this layer's MLP output, the stream before it)."""
        h, residual = self.input_layernorm.add(x, residual)
        h, residual = self.post_attention_layernorm.add(self.self_attn(rope, h), residual)
        return self.mlp(h), residual


class Qwen3MoeModel(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3MoeDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(self.layers[0].self_attn.head_dim, rope_parameters(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary(positions)
        residual: Optional[torch.Tensor] = None
        for layer in self.layers:
            x, residual = layer(rope, x, residual)
        return self.norm.add(x, residual)[0]


class Qwen3MoeForCausalLM(CausalLM):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        check_config(cfg)
        self.config = cfg
        self.model = Qwen3MoeModel(cfg)
        self.attach_lm_head()
