"""A Gemma 3 decoder stack's step (decode, verification, prefill) in one C call
(kernels/cpu_decoder_gemma.c).

Layer by layer, Gemma 3 270M's one-stream decode step makes 72 quantized-matmul calls (each
an OpenMP region of its own) and about twice as many for norms, adds, rope, attention and the
activation, each through Python modules and ctypes: several ms of a step whose math already
runs in our C kernels. Where every piece of the stack would run them anyway (the conditions of
models/llama_fused.py, whose helpers this module uses: kernels on, float32, attention on the
CPU kernel, one rank, every linear weight quantized or multiplied by our float32 matmul;
and here GELU-tanh, (1 + w) norms, no soft-capped attention), `gemma_stack` runs all layers in
one call, each layer with its own sliding window and rope table (local or global): the same
kernels in the same order on the same shapes, so the result is bit-identical to the
layer-by-layer path (tests/models/test_gemma3_fused.py). Anything else returns None and the
layers run as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from tandem.attention.context import get_forward_context
from tandem.kernels import cpu as cpu_kernels
from tandem.layers.activation import gelu_tanh_and_mul
from tandem.layers.rotary import Rope
from tandem.models.llama_fused import DecoderStack, prepare, stack_dims

_POINTERS = 13  # per layer, in cpu_decoder_gemma.c's order


@dataclass
class _Plan:
    """What a Gemma 3 stack needs for the fused call, checked once per model."""
    dims: torch.Tensor     # [7] int64, llama_fused.stack_dims's
    kinds: torch.Tensor    # [layers, 2] int64: sliding window (0: every key), 1 for local rope
    eps: float
    qk_eps: float
    scale: float
    weights: list[torch.Tensor]  # one of each linear shape, for the matmul choice (float only)
    table: Optional[torch.Tensor] = None  # [layers, 13] int64 addresses, once caches are bound
    table_key: tuple = ()


def _plan(model: DecoderStack) -> Optional[_Plan]:
    common = stack_dims(model)
    if common is None:
        return None
    layers = list(model.layers)
    norms = [n for layer in layers for n in (
        layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
        layer.post_feedforward_layernorm)] + [model.norm]
    attns = [layer.self_attn for layer in layers]
    qk = [n for a in attns for n in (a.q_norm, a.k_norm)]
    ok = (all(n.eps == model.norm.eps and n.unit_offset for n in norms)
          and (all(n is None for n in qk) or all(  # q/k norms everywhere or nowhere
              n is not None and n.eps == qk[0].eps and n.unit_offset for n in qk))
          and all(a.attn.softcap is None and a.attn.scale == attns[0].attn.scale
                  for a in attns)  # Gemma 2's soft-capped scores are not in the C attention
          and all(layer.mlp.act is gelu_tanh_and_mul for layer in layers))
    if not ok:
        return None
    kinds = torch.tensor([[a.attn.sliding_window or 0, int(layer.sliding)]
                          for a, layer in zip(attns, layers)], dtype=torch.int64)
    return _Plan(dims=common[0], kinds=kinds, eps=model.norm.eps,
                 qk_eps=qk[0].eps if qk[0] is not None else 0.0,
                 scale=attns[0].attn.scale, weights=common[1])


def _gemma_tensors(layer: nn.Module) -> list:
    """A layer's addresses in cpu_decoder_gemma.c's order."""
    at, mlp = layer.self_attn, layer.mlp
    tensors = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
               layer.pre_feedforward_layernorm.weight, layer.post_feedforward_layernorm.weight,
               at.qkv_proj, at.qkv_proj.bias, at.o_proj, mlp.gate_up_proj, mlp.down_proj,
               at.q_norm.weight if at.q_norm is not None else None,
               at.k_norm.weight if at.k_norm is not None else None,
               at.attn.k_cache, at.attn.v_cache]
    assert len(tensors) == _POINTERS
    return tensors


def gemma_stack(model: DecoderStack, x: torch.Tensor, rope_local: Rope,
                rope_global: Rope) -> Optional[torch.Tensor]:
    """The final norm's output [T, hidden] for scaled embeddings x [T, hidden] (sliding layers
    rotate by rope_local, the others by rope_global), or None where the fused call does not
    apply."""
    ready = prepare(model, x, _plan, _gemma_tensors)
    if ready is None:
        return None
    meta, plan, table = ready
    return cpu_kernels.gemma_stack(x, plan.dims, table, plan.kinds, model.norm.weight, plan.eps,
                                   plan.qk_eps, rope_local, rope_global,
                                   get_forward_context().slot_mapping, meta.requests, meta.kv_slots,
                                   plan.scale)
