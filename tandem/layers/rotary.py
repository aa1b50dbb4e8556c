"""Rotary position embeddings (half-rotation layout, as the HF Llama/Qwen/Gemma code uses).

Supports rope_type "default", "linear", "llama3" and "longrope" (Phi-3) from a config's rope
parameters, over the whole head or its first `rotary_dim` dimensions (partial rotary, with the
head's dimensions permuted at load: see `partial_rotary_order`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, signed sin), each [T, 1, head_dim]
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


def rope_parameters(hf_config: Any, layer_type: Optional[str] = None) -> dict:
    """The rope dict for a layer type, from transformers>=5 `rope_parameters` or older keys."""
    params = getattr(hf_config, "rope_parameters", None)
    if params and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not params:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def inv_frequencies(head_dim: int, params: dict, long: bool = False) -> torch.Tensor:
    """[head_dim / 2] inverse frequencies; `long` picks LongRoPE's long factors."""
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(params["factor"])
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    if kind == "longrope":  # one divisor per frequency, short or long (Phi-3)
        key = "long_factor" if long else "short_factor"
        factors = torch.tensor(params[key], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope_parameters.{key} has {factors.numel()} values; the rotary "
                             f"dimension {head_dim} needs {head_dim // 2}.")
        # as transformers: 1 / (factor * base^(2i/d)), not (1 / base^(2i/d)) / factor
        return 1.0 / (factors * base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                         / head_dim))
    raise ValueError(f"Unsupported rope_type {kind!r}; supported: {list(SUPPORTED_ROPE_TYPES)}.")


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for a batch's positions once per forward; layers share the result.

    With rotary_dim < head_dim (partial rotary) the tables stay head_dim wide: the q/k weights'
    rows were permuted at load (`partial_rotary_order`) so that the rotated pairs are (i, i + D/2)
    for i < rotary_dim / 2, and the other dimensions get cos 1, sin 0 (x * 1 + y * 0 is x
    exactly), so every rope path (the fused kernels included) applies unchanged.
    `attention_factor` scales the rotated dimensions' cos and sin (LongRoPE's attention scaling)."""

    def __init__(self, head_dim: int, params: dict, rotary_dim: Optional[int] = None,
                 attention_factor: float = 1.0, long: bool = False) -> None:
        super().__init__()
        rotary_dim = rotary_dim or head_dim
        self.pad = (head_dim - rotary_dim) // 2
        self.attention_factor = attention_factor
        self.register_buffer("inv_freq", inv_frequencies(rotary_dim, params, long),
                             persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [T, R/2]
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        if self.pad:  # pass-through dimensions: [T, R/2] -> [T, D/2]
            cos = torch.cat((cos, cos.new_ones(cos.shape[0], self.pad)), -1)
            sin = torch.cat((sin, sin.new_zeros(sin.shape[0], self.pad)), -1)
        # Full-width tables, the sine signed for the rotated half: x * cos + rotate(x) * sin.
        return (torch.cat((cos, cos), -1).unsqueeze(1),
                torch.cat((-sin, sin), -1).unsqueeze(1))  # [T, 1, D] each


def partial_rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """[head_dim] source dimension of each stored q/k dimension for partial rotary: the checkpoint
    rotates pairs (i, i + R/2) of its first R dimensions and passes the rest through; stored in
    this order, the rotated pairs become (i, i + D/2), the layout the full-width tables rotate.
    q . k is a sum over dimensions, so permuting q's and k's alike changes no score."""
    r2, p2 = rotary_dim // 2, (head_dim - rotary_dim) // 2
    return torch.cat((torch.arange(r2), torch.arange(rotary_dim, rotary_dim + p2),
                      torch.arange(r2, rotary_dim), torch.arange(rotary_dim + p2, head_dim)))


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [T, heads, D] (any strides) rotated by (cos, sin) from RotaryEmbedding: the halves
    (x1, x2) become (x1 cos - x2 sin, x2 cos + x1 sin), in four ops rather than eight."""
    cos, sin = rope
    dtype = x.dtype
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((x2, x1), dim=-1)  # a new tensor, so the in-place ops below are safe
    return (xf * cos).add_(rotated.mul_(sin)).to(dtype)


def rotate_qk(heads: torch.Tensor, rope: Rope, num_heads: int,
              q_norm: Optional[nn.Module] = None,
              k_norm: Optional[nn.Module] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """heads [T, H + 2 Hkv, D] (q, k, v heads of the fused projection) -> rotated q [T, H, D]
    and k [T, Hkv, D], each head RMS-normalised first when q_norm/k_norm are given."""
    h = num_heads
    hkv = (heads.shape[1] - h) // 2
    if q_norm is None:
        qk = apply_rotary(heads[:, :h + hkv], rope)  # q and k heads rotated in one pass
        return qk[:, :h], qk[:, h:]
    return (apply_rotary(q_norm(heads[:, :h]), rope),
            apply_rotary(k_norm(heads[:, h:h + hkv]), rope))
