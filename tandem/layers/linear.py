"""Linear layers that shard their own weights for tensor parallelism.

Each parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that copies this
rank's slice of a full checkpoint tensor, so model files never mention ranks. Column-parallel layers
split the output dimension; row-parallel ones split the input and all-reduce the result.
Fused layers (QKV, gate/up) load each checkpoint tensor into its own row range.

Built inside `quantized_build(mode)` (layers/quantized.py), a layer keeps no float weight: its
parameter is a meta tensor (the shape), its parts arrive through `quant_loader` at the same row
offsets, and `qweight` multiplies them once loaded.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from tandem.distributed.parallel_state import current_group
from tandem.layers.matmul_choice import bf16_linear, kernel_for
from tandem.layers.quantized import QuantizedWeight, QuantParts, build_mode


def linear(x: torch.Tensor, weight: Union[torch.Tensor, QuantizedWeight],
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [T, in] @ weight[out, in].T (+ bias) -> [T, out]. On CPU in float32 through oneDNN or
    BLAS, whichever measured faster on this machine for this shape, or against bfloat16 weights
    where TANDEM_CPU_MATMUL=bf16 stored them so (layers/matmul_choice.py); quantized weights
    through their own kernels."""
    if isinstance(weight, QuantizedWeight):
        return weight.matmul(x, bias)
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2:
        if weight.dtype == torch.bfloat16:
            return bf16_linear(x, weight, bias)
        return kernel_for(x, weight, bias)(x, weight, bias)
    return F.linear(x, weight, bias)


def make_weight(module: nn.Module, rows: int, cols: int) -> nn.Parameter:
    """A [rows, cols] weight parameter: float storage, or, inside `quantized_build`, a meta
    tensor whose parts `module.quant_loader` collects (module.row_offset places each)."""
    module.qweight = None
    module.quant_parts = None
    mode = build_mode()
    if mode is None:
        return nn.Parameter(torch.empty(rows, cols), requires_grad=False)
    if getattr(module, "tp", 1) > 1:
        raise ValueError("quantized weights run at tensor_parallel_size 1 only")
    module.quant_parts = QuantParts(mode, (rows, cols))
    param = nn.Parameter(torch.empty(rows, cols, device="meta"), requires_grad=False)
    param.quant_loader = lambda part, shard_id=None: module.quant_parts.add(
        module.row_offset(shard_id), part)
    return param


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.group = current_group()
        self.tp = self.group.size
        assert out_features % self.tp == 0, f"{out_features} not divisible by tp={self.tp}"
        self.out_per_rank = out_features // self.tp
        self.weight = make_weight(self, self.out_per_rank, in_features)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_per_rank), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: Optional[Union[int, str]] = None) -> None:
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.group.rank * size, size))

    def row_offset(self, shard_id: Optional[Union[int, str]]) -> int:
        """Where a checkpoint tensor's rows start in the weight (at one rank)."""
        return 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.qweight if self.qweight is not None else self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate_proj and up_proj)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: Optional[Union[int, str]] = None) -> None:
        assert isinstance(shard_id, int)
        size = self.output_sizes[shard_id] // self.tp
        offset = sum(self.output_sizes[:shard_id]) // self.tp
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.group.rank * size, size))

    def row_offset(self, shard_id: Optional[Union[int, str]]) -> int:
        assert isinstance(shard_id, int)
        return sum(self.output_sizes[:shard_id])


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; each rank owns whole heads."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False) -> None:
        tp = current_group().size
        self.head_dim = head_dim
        self.num_heads = num_heads // tp
        self.num_kv_heads = max(1, num_kv_heads // tp)  # replicate kv heads when tp > num_kv_heads
        super().__init__(hidden, (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: Optional[Union[int, str]] = None) -> None:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        # With more ranks than kv heads, neighbouring ranks share (replicate) a kv head.
        rank = self.group.rank
        if shard_id != "q":
            rank = rank * (loaded.shape[0] // size) // self.tp
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, rank * size, size))

    def row_offset(self, shard_id: Optional[Union[int, str]]) -> int:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"q": 0, "k": q, "v": q + kv}[shard_id]


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.group = current_group()
        self.tp = self.group.size
        assert in_features % self.tp == 0, f"{in_features} not divisible by tp={self.tp}"
        self.weight = make_weight(self, out_features, in_features // self.tp)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = lambda p, w, s=None: p.data.copy_(w)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: Optional[Union[int, str]] = None) -> None:
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.group.rank * size, size))

    def row_offset(self, shard_id: Optional[Union[int, str]]) -> int:
        return 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Bias is added once, after the reduction.
        w = self.qweight if self.qweight is not None else self.weight
        y = self.group.all_reduce(linear(x, w))
        return y if self.bias is None else y + self.bias
