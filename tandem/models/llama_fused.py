"""A Llama-family decoder stack's step (decode, verification, prefill) in one C call
(kernels/cpu_decoder.c).

Layer by layer, a step makes about a hundred Python-level calls per layer (modules, wrappers,
kernel choice, ctypes), a tenth of a small model's single-stream step, while the
math itself already runs in our C kernels. When every piece of the stack would run them anyway
(float32 on the CPU with the kernels on, our matmul for every weight (the default),
attention on the CPU kernel, one rank, SiLU, no bias but q/k/v's, no sliding window; or
every layer's weights quantized, which only our kernels multiply),
`fused_stack` runs all layers in one call: the same kernels in the same order on the same
shapes, so the result is bit-identical to the layer-by-layer path
(tests/models/test_llama_fused.py). Anything else returns None and the layers run as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol, TypeVar

import torch
from torch import nn

from tandem.attention.context import get_forward_context
from tandem.attention.metadata import AttentionMetadata
from tandem.kernels import cpu as cpu_kernels
from tandem.layers import matmul_choice
from tandem.layers.activation import silu_and_mul
from tandem.layers.quantized import is_quantized
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import Rope


class DecoderStack(Protocol):
    """What the fused call reads of a Llama-family model (models/llama.py's `LlamaModel`, which
    imports this module, so the type is named here by its shape; Gemma 3's model alike): the
    decoder layers, each with `self_attn`, `mlp` and its norms, and the final norm."""
    layers: nn.ModuleList
    norm: RMSNorm

    def parameters(self) -> Iterator[nn.Parameter]: ...


class FusedPlan(Protocol):
    """What the helpers below read of a fused stack's plan (this module's, gemma3_fused's)."""
    dims: torch.Tensor           # [7] int64: stack_dims's
    weights: list[torch.Tensor]  # one of each float linear shape (c_multiplies checks them)
    table: Optional[torch.Tensor]
    table_key: tuple


P = TypeVar("P", bound=FusedPlan)
_POINTERS = 11  # per layer, in cpu_decoder.c's order


@dataclass
class _Plan:
    """What a model's stack needs for the fused call, checked once per model."""
    dims: torch.Tensor          # [7] int64: hidden, intermediate, heads, KV heads, head size,
                                #   1 where the weights are quantized (descriptors in the table),
                                #   the KV caches' format code
    eps: float
    qk_eps: float
    qk_unit_offset: bool
    scale: float
    weights: list[torch.Tensor]  # one of each float linear shape (c_multiplies checks them)
    table: Optional[torch.Tensor] = None  # [layers, 11] int64 addresses, once caches are bound
    table_key: tuple = ()


def f32(t: Optional[torch.Tensor]) -> bool:
    return t is None or (t.dtype is torch.float32 and t.is_cpu and t.is_contiguous())


def stack_dims(model: DecoderStack) -> Optional[tuple[torch.Tensor, list[torch.Tensor]]]:
    """What both C stacks need of any model (Llama's and Gemma's): (dims, weights) where the
    layers have one rank, no bias but q/k/v's, float32 CPU parameters, a head size the kernels
    take, every linear weight quantized or none, and one KV cache format; else None. dims: [7]
    int64 (hidden, intermediate, heads, KV heads, head size, 1 for quantized, the caches' format
    code: attention/kv_format.py); weights: one of each float linear shape (none when
    quantized: only our kernels multiply them)."""
    layers = list(model.layers)
    if not layers:
        return None
    a0, m0 = layers[0].self_attn, layers[0].mlp
    ok = (all(layer.self_attn.qkv_proj.tp == 1 and layer.self_attn.o_proj.bias is None
              and layer.mlp.gate_up_proj.bias is None and layer.mlp.down_proj.bias is None
              for layer in layers)
          and all(f32(p) for p in model.parameters() if not p.is_meta)
          and a0.head_dim % 2 == 0 and cpu_kernels.attention_takes(a0.head_dim)
          and len({layer.self_attn.attn.kv_format for layer in layers}) == 1)
    quantized = {is_quantized(m) for layer in layers for m in layer_linears(layer)}
    if not ok or len(quantized) != 1:  # every weight quantized, or none
        return None
    q = quantized.pop()
    dims = torch.tensor([a0.qkv_proj.weight.shape[1], m0.down_proj.weight.shape[1],
                         a0.num_heads, a0.num_kv_heads, a0.head_dim, int(q),
                         a0.attn.kv_format.code])
    return dims, [] if q else [m.weight for m in layer_linears(layers[0])]


def _plan(model: DecoderStack) -> Optional[_Plan]:
    common = stack_dims(model)
    if common is None:
        return None
    layers = list(model.layers)
    norms = [n for layer in layers for n in (layer.input_layernorm,
                                             layer.post_attention_layernorm)] + [model.norm]
    qk = [(a.q_norm, a.k_norm) for a in (layer.self_attn for layer in layers)]
    q_norm = qk[0][0]
    ok = (all(n.eps == model.norm.eps and not n.unit_offset for n in norms)
          and all((q is None) == (k is None) == (q_norm is None) for q, k in qk)
          and all(q is None or (q.eps == k.eps == q_norm.eps and q.unit_offset ==
                                k.unit_offset == q_norm.unit_offset) for q, k in qk)
          and all(layer.mlp.act is silu_and_mul and layer.self_attn.attn.sliding_window is None
                  and getattr(layer, "residual_multiplier", 1.0) == 1.0  # Granite's: not in C
                  for layer in layers))
    if not ok:
        return None
    return _Plan(dims=common[0], eps=model.norm.eps,
                 qk_eps=q_norm.eps if q_norm is not None else 0.0,
                 qk_unit_offset=bool(q_norm is not None and q_norm.unit_offset),
                 scale=layers[0].self_attn.attn.scale, weights=common[1])


def layer_linears(layer: nn.Module) -> list[nn.Module]:
    """A layer's four linear layers (Llama's and Gemma's alike)."""
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj]


def weight_address(module: nn.Module) -> int:
    """A float32 weight's data, or a quantized weight's descriptor (kernels/cpu_quant.c)."""
    q = module.qweight
    return q.desc.data_ptr() if q is not None else module.weight.data_ptr()


def address_table(model: DecoderStack, plan: FusedPlan,
                  layer_tensors: Callable[[nn.Module], list]) -> Optional[torch.Tensor]:
    """Each layer's weight and cache addresses ([layers, pointers] int64, 0 for None), from
    `layer_tensors(layer)` (tensors, linear modules, None), in the C stack's order; rebuilt
    when the caches are rebound. None while a cache is not bound (in its format's dtype)."""
    first, last = model.layers[0].self_attn.attn, model.layers[-1].self_attn.attn
    key = (first.k_cache.data_ptr(), last.v_cache.data_ptr(), first.k_cache.shape)
    if plan.table is None or plan.table_key != key:  # (every layer's modules: 1% of a step)
        attns = [layer.self_attn.attn for layer in model.layers]
        if not all(a.k_cache.numel() and a.kv_format.code == int(plan.dims[6])
                   and all(c.is_cpu and c.is_contiguous() and c.dtype == a.kv_format.storage
                           for c in (a.k_cache, a.v_cache)) for a in attns):
            return None
        rows = [[0 if t is None else weight_address(t) if isinstance(t, nn.Module)
                 else t.data_ptr() for t in layer_tensors(layer)] for layer in model.layers]
        plan.table, plan.table_key = torch.tensor(rows, dtype=torch.int64), key
    return plan.table


def _llama_tensors(layer: nn.Module) -> list:
    """A layer's addresses in cpu_decoder.c's order."""
    at, mlp = layer.self_attn, layer.mlp
    tensors = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
               at.qkv_proj, at.qkv_proj.bias, at.o_proj, mlp.gate_up_proj, mlp.down_proj,
               at.q_norm.weight if at.q_norm is not None else None,
               at.k_norm.weight if at.k_norm is not None else None,
               at.attn.k_cache, at.attn.v_cache]
    assert len(tensors) == _POINTERS
    return tensors


def step_group(x: torch.Tensor) -> Optional[AttentionMetadata]:
    """The step's attention metadata where a fused stack may run on x [T, hidden] (kernels on,
    float32, the attention kernel's view of every request), else None."""
    if not cpu_kernels.enabled() or not f32(x):
        return None
    meta = get_forward_context()
    return None if meta.requests is None else meta


def model_plan(model: DecoderStack, build: Callable[[DecoderStack], Optional[P]]) -> Optional[P]:
    """build(model), once per model (None: the stack never runs fused)."""
    plan = model.__dict__.get("_fused_plan", False)
    if plan is False:
        plan = model.__dict__["_fused_plan"] = build(model)
    return plan


def c_multiplies(x: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Our C matmul is the one chosen for x against each float weight (a quantized plan lists
    no weights: only our kernels multiply them)."""
    return all(matmul_choice.kernel_for(x, w, None) is matmul_choice._c for w in weights)


def prepare(model: DecoderStack, x: torch.Tensor, build: Callable[[DecoderStack], Optional[P]],
            tensors: Callable[[nn.Module], list]
            ) -> Optional[tuple[AttentionMetadata, P, torch.Tensor]]:
    """The step's attention metadata, the model's plan and its address table where a fused stack
    runs this step on x [T, hidden] (see step_group, model_plan, c_multiplies, address_table),
    else None."""
    meta = step_group(x)
    if meta is None:
        return None
    plan = model_plan(model, build)
    if plan is None or not c_multiplies(x, plan.weights):
        return None
    table = address_table(model, plan, tensors)
    return None if table is None else (meta, plan, table)


def fused_stack(model: DecoderStack, x: torch.Tensor, rope: Rope) -> Optional[torch.Tensor]:
    """The final norm's output [T, hidden] for embeddings x [T, hidden], or None where the
    fused call does not apply."""
    ready = prepare(model, x, _plan, _llama_tensors)
    if ready is None:
        return None
    meta, plan, table = ready
    return cpu_kernels.llama_stack(x, plan.dims, table, model.norm.weight, plan.eps, plan.qk_eps,
                                   plan.qk_unit_offset, rope, get_forward_context().slot_mapping,
                                   meta.requests, meta.kv_slots, plan.scale)
