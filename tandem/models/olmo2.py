"""Olmo2ForCausalLM: the Llama layers with norms after each sublayer instead of before it
(x + norm(attn(x)), then x + norm(mlp(x))), and q/k RMS norms over the whole q and k
projections (all heads at once) before the heads are split and rotated."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from tandem.distributed.parallel_state import current_group
from tandem.layers.attention import Attention
from tandem.layers.embedding import Embedding
from tandem.layers.linear import QKVParallelLinear, RowParallelLinear
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from tandem.models.causal_lm import CausalLM
from tandem.models.config_fields import require
from tandem.models.llama import GatedMLP

FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "rms_norm_eps", "vocab_size")


class ProjectionNorm(RMSNorm):
    """RMSNorm over a whole projection [T, heads * D] whose heads are split over the ranks: each
    rank holds rows [offset, offset + local) of the weight, and the mean square is summed over
    the ranks (divided by `replicas` where ranks hold copies of the same KV heads)."""

    def __init__(self, full: int, local: int, offset: int, replicas: int, eps: float) -> None:
        super().__init__(local, eps)
        self.group = current_group()
        self.full, self.offset, self.replicas = full, offset, replicas
        self.weight.weight_loader = self._load

    def _load(self, param: nn.Parameter, loaded: torch.Tensor,
              shard_id: Optional[Union[int, str]] = None) -> None:
        param.data.copy_(loaded.narrow(0, self.offset, param.shape[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, local]
        if self.group.size == 1:
            return super().forward(x)
        xf = x.float()
        sq = self.group.all_reduce(xf.pow(2).sum(-1, keepdim=True)) / self.replicas  # [T, 1]
        return (self.weight * (xf * torch.rsqrt(sq / self.full + self.eps))).to(x.dtype)


class Olmo2Attention(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        bias = getattr(cfg, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, d, heads, kv_heads, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        tp, rank = self.qkv_proj.tp, self.qkv_proj.group.rank
        self.o_proj = RowParallelLinear(heads * d, cfg.hidden_size, bias=bias)
        # Each rank's k rows: the KV head chunk QKVParallelLinear gave it (shared when
        # there are fewer KV heads than ranks).
        chunks = kv_heads // self.num_kv_heads
        self.q_norm = ProjectionNorm(heads * d, self.num_heads * d, rank * self.num_heads * d, 1,
                                     cfg.rms_norm_eps)
        self.k_norm = ProjectionNorm(kv_heads * d, self.num_kv_heads * d,
                                     rank * chunks // tp * self.num_kv_heads * d,
                                     max(1, tp // chunks), cfg.rms_norm_eps)
        self.attn = Attention(self.num_heads, self.num_kv_heads, d, d ** -0.5)

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        q_end = self.num_heads * self.head_dim
        k_end = q_end + self.num_kv_heads * self.head_dim
        qkv = torch.cat((self.q_norm(qkv[:, :q_end]), self.k_norm(qkv[:, q_end:k_end]),
                         qkv[:, k_end:]), dim=-1)
        return self.o_proj(self.attn.forward_qkv(qkv, rope))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.self_attn = Olmo2Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(rope, x))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2Model(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Olmo2DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(self.layers[0].self_attn.head_dim, rope_parameters(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary(positions)
        for layer in self.layers:
            x = layer(rope, x)
        return self.norm(x)


class Olmo2ForCausalLM(CausalLM):
    def __init__(self, cfg: Any) -> None:
        require(cfg, "Olmo2ForCausalLM", *FIELDS)
        super().__init__()
        self.config = cfg
        self.model = Olmo2Model(cfg)
        self.attach_lm_head()
