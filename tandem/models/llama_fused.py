"""A Llama-family decoder stack's decode or verify step in one C call (kernels/cpu_decoder.c).

Layer by layer, a step makes about a hundred Python-level calls per layer (modules, wrappers,
kernel choice, ctypes), some 3 ms of a 30 ms single-stream step on the AMX Xeon, while the
math itself already runs in our C kernels. When every piece of the stack would run them anyway
(float32 on the CPU with the kernels on, our matmul chosen for each weight at this batch size,
one decode/verify attention group, one rank, SiLU, no bias but q/k/v's, no sliding window; or
every layer's weights quantized, which only our kernels multiply),
`fused_stack` runs all layers in one call: the same kernels in the same order on the same
shapes, so the result is bit-identical to the layer-by-layer path
(tests/models/test_llama_fused.py). Anything else returns None and the layers run as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Protocol

import torch
from torch import nn

from tandem.attention.context import get_forward_context
from tandem.kernels import cpu as cpu_kernels
from tandem.layers import matmul_choice
from tandem.layers.activation import silu_and_mul
from tandem.layers.quantized import is_quantized
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope


class DecoderStack(Protocol):
    """What the fused call reads of a Llama-family model (models/llama.py's `LlamaModel`, which
    imports this module, so the type is named here by its shape): the decoder layers, each with
    `self_attn`, `mlp`, `input_layernorm` and `post_attention_layernorm`, and the final norm."""
    layers: nn.ModuleList
    norm: RMSNorm

    def parameters(self) -> Iterator[nn.Parameter]: ...

_POINTERS = 11  # per layer, in cpu_decoder.c's order


@dataclass
class _Plan:
    """What a model's stack needs for the fused call, checked once per model."""
    dims: torch.Tensor          # [6] int64: hidden, intermediate, heads, KV heads, head size,
                                #   1 where the weights are quantized (descriptors in the table)
    eps: float
    qk_eps: float
    qk_unit_offset: bool
    scale: float
    weights: list[torch.Tensor]  # one of each linear shape, for the matmul choice (float only)
    table: Optional[torch.Tensor] = None  # [layers, 11] int64 addresses, once caches are bound
    table_key: tuple = ()


def _f32(t: Optional[torch.Tensor]) -> bool:
    return t is None or (t.dtype is torch.float32 and t.is_cpu and t.is_contiguous())


def _plan(model: DecoderStack) -> Optional[_Plan]:
    layers = list(model.layers)
    if not layers:
        return None
    a0, m0 = layers[0].self_attn, layers[0].mlp
    norms = [n for layer in layers for n in (layer.input_layernorm,
                                             layer.post_attention_layernorm)] + [model.norm]
    qk = [(a.q_norm, a.k_norm) for a in (layer.self_attn for layer in layers)]
    ok = (all(n.eps == model.norm.eps and not n.unit_offset for n in norms)
          and all((q is None) == (k is None) == (qk[0][0] is None) for q, k in qk)
          and all(q is None or (q.eps == k.eps == qk[0][0].eps and q.unit_offset ==
                                k.unit_offset == qk[0][0].unit_offset) for q, k in qk)
          and all(layer.self_attn.qkv_proj.tp == 1 and layer.self_attn.o_proj.bias is None
                  and layer.mlp.gate_up_proj.bias is None and layer.mlp.down_proj.bias is None
                  and layer.mlp.act is silu_and_mul and layer.self_attn.attn.sliding_window is None
                  and getattr(layer, "residual_multiplier", 1.0) == 1.0  # Granite's: not in C
                  for layer in layers)
          and all(_f32(p) for p in model.parameters() if not p.is_meta)
          and a0.head_dim % 2 == 0 and cpu_kernels.attention_takes(a0.head_dim))
    linears = [m for layer in layers for m in _linears(layer)]
    quantized = [is_quantized(m) for m in linears]
    if not ok or len(set(quantized)) != 1:  # every weight quantized, or none
        return None
    q_norm = qk[0][0]
    return _Plan(dims=torch.tensor([a0.qkv_proj.weight.shape[1], m0.down_proj.weight.shape[1],
                                    a0.num_heads, a0.num_kv_heads, a0.head_dim,
                                    int(quantized[0])]),
                 eps=model.norm.eps, qk_eps=q_norm.eps if q_norm is not None else 0.0,
                 qk_unit_offset=bool(q_norm is not None and q_norm.unit_offset),
                 scale=a0.attn.scale,
                 weights=[] if quantized[0] else [m.weight for m in _linears(layers[0])])


def _linears(layer: nn.Module) -> list[nn.Module]:
    """A layer's four linear layers, in cpu_decoder.c's table order."""
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj]


def _weight_address(module: nn.Module) -> int:
    """A float32 weight's data, or a quantized weight's descriptor (kernels/cpu_quant.c)."""
    q = module.qweight
    return q.desc.data_ptr() if q is not None else module.weight.data_ptr()


def _table(model: DecoderStack, plan: _Plan) -> Optional[torch.Tensor]:
    """Each layer's weight and cache addresses, rebuilt when the caches are rebound."""
    attns = [layer.self_attn.attn for layer in model.layers]
    key = (attns[0].k_cache.data_ptr(), attns[-1].v_cache.data_ptr(), attns[0].k_cache.shape)
    if plan.table is None or plan.table_key != key:
        if not all(_f32(a.k_cache) and _f32(a.v_cache) and a.k_cache.numel() for a in attns):
            return None
        rows = []
        for layer in model.layers:
            at, mlp = layer.self_attn, layer.mlp
            tensors = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                       at.qkv_proj, at.qkv_proj.bias, at.o_proj, mlp.gate_up_proj,
                       mlp.down_proj, at.q_norm.weight if at.q_norm is not None else None,
                       at.k_norm.weight if at.k_norm is not None else None,
                       at.attn.k_cache, at.attn.v_cache]
            rows.append([0 if t is None else _weight_address(t) if isinstance(t, nn.Module)
                         else t.data_ptr() for t in tensors])
        assert len(rows[0]) == _POINTERS
        plan.table, plan.table_key = torch.tensor(rows, dtype=torch.int64), key
    return plan.table


def fused_stack(model: DecoderStack, x: torch.Tensor, rope: Rope) -> Optional[torch.Tensor]:
    """The final norm's output [T, hidden] for embeddings x [T, hidden], or None where the
    fused call does not apply."""
    if not cpu_kernels.enabled() or not _f32(x) or x.shape[0] > matmul_choice.C_MAX_ROWS:
        return None
    meta = get_forward_context()
    groups = meta.groups
    if len(groups) != 1 or not groups[0].small or groups[0].requests is None:
        return None
    plan = model.__dict__.get("_fused_plan", False)
    if plan is False:  # once per model: the plan, and the matmul for its shapes, decided as one
        plan = model.__dict__["_fused_plan"] = _plan(model)
        if plan is not None:
            matmul_choice.choose_c_together(plan.weights)
    if plan is None:
        return None
    # (a quantized plan lists no weights: only our kernels multiply them)
    if any(matmul_choice.kernel_for(x, w, None) is not matmul_choice._c for w in plan.weights):
        return None
    table = _table(model, plan)
    if table is None:
        return None
    g = groups[0]
    return cpu_kernels.llama_stack(x, plan.dims, table, model.norm.weight, plan.eps, plan.qk_eps,
                                   plan.qk_unit_offset, rope, meta.slot_mapping,
                                   g.requests, g.kv_slots, plan.scale)
