"""A mixture-of-experts MLP block (Qwen3-MoE's, usable by any family): a router picks k of E
SwiGLU experts per token, and the token's output is their router-weighted sum.

Each token is routed on its own (the router is a per-row matmul, softmax and top-k), and the
experts run grouped by expert, not by token: the rows that chose expert e are gathered, go
through e's gate/up and down matmuls together, and are scattered back, scaled by their router
weight. So a step reads each selected expert's weights once, however many rows chose it, and
never touches the others. Experts are visited in ascending order and each adds into the output
in that order, so a row's sum is the same whatever else is in its batch (the matmuls compute
each row alone, layers/matmul_choice.py): speculative verification gives plain decoding's bits.

Experts are ordinary fused gate/up and down linear layers, so quantized weights
(layers/quantized.py), the bf16 CPU mode and tensor parallelism apply to them as to a dense
MLP. With tensor parallelism every rank holds a 1/tp slice of every expert's intermediate
dimension (column-parallel gate/up, row-parallel down) and the whole router: every rank makes
the same routing choice with no communication, every rank's work is the same whatever the
routing, and the block ends in one all-reduce, as a dense MLP does.
"""

from __future__ import annotations

import torch
from torch import nn

from tandem.distributed.parallel_state import current_group
from tandem.layers.activation import get_act_and_mul
from tandem.layers.linear import MergedColumnParallelLinear, RowParallelLinear, linear
from tandem.layers.quantized import QuantizedWeight


class TopKRouter(nn.Module):
    """Router logits (a replicated linear), softmax in float32, the top k experts per row,
    their probabilities renormalised to sum to 1 where `renormalize` (config.norm_topk_prob)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, renormalize: bool) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        # Kept float (never quantized): a small matrix whose rounding would move routing choices.
        self.weight = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k] int64), each row's
        experts by descending probability."""
        logits = linear(x, self.weight)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids


class Expert(nn.Module):
    """One SwiGLU expert: fused gate/up (column-parallel) and down (row-parallel)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2)
        self.down_proj = RowParallelLinear(intermediate, hidden)


def _weight(module: nn.Module):
    return module.qweight if module.qweight is not None else module.weight


class SparseMoeBlock(nn.Module):
    # Reads each expert's row count on the host mid-step (one sync), which a CUDA graph cannot
    # hold: worker/graph_runner.py runs such models eagerly.
    syncs_host = True

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int,
                 renormalize: bool, act: str) -> None:
        super().__init__()
        self.group = current_group()
        self.gate = TopKRouter(hidden, num_experts, top_k, renormalize)
        self.experts = nn.ModuleList(Expert(hidden, intermediate) for _ in range(num_experts))
        self.act = get_act_and_mul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        weights, ids = self.gate(x)  # [T, k] each
        if x.shape[0] == 1:
            return self.group.all_reduce(self._one_row(x, weights[0], ids[0]))
        k = ids.shape[1]
        flat = ids.reshape(-1)  # [T k]: slot s is token s // k's choice number s % k
        # Slots grouped by expert; stable, so each expert's rows keep token order.
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # one sync
        tokens = order // k  # [T k] the token of each sorted slot
        slot_weights = weights.reshape(-1)[order].unsqueeze(1)  # [T k, 1]
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue  # never read: only selected experts cost memory traffic
            expert = self.experts[e]
            rows = tokens[start:start + n]  # [n]
            h = linear(x.index_select(0, rows), _weight(expert.gate_up_proj))  # [n, 2 I/tp]
            y = linear(self.act(h), _weight(expert.down_proj))  # [n, hidden], this rank's part
            out.index_add_(0, rows, y * slot_weights[start:start + n])
            start += n
        # One reduction for the whole block (each expert's down projection is row-parallel).
        return self.group.all_reduce(out)

    def _one_row(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """A one-row step (single-stream decode), x [1, hidden], weights/ids [k]: forward's
        arithmetic (each expert's matmuls, then out += w * y in ascending expert order) without
        the gather and scatter, and with every selected expert's gate/up in one call where they
        are quantized (each output is the same fixed-order dot product in any call)."""
        chosen = ids.tolist()
        order = sorted(range(len(chosen)), key=chosen.__getitem__)  # ascending expert id
        experts = [self.experts[chosen[i]] for i in order]
        gate_ups = [e.gate_up_proj.qweight for e in experts]
        if all(q is not None for q in gate_ups):
            both = QuantizedWeight([s for q in gate_ups for s in q.segments])
            h = both.matmul(x, None).view(len(experts), -1)  # [k, 2 I/tp]
        else:
            h = torch.cat([linear(x, _weight(e.gate_up_proj)) for e in experts])
        act = self.act(h)  # [k, I/tp]
        out = torch.zeros_like(x)
        for i, expert in enumerate(experts):
            y = linear(act[i:i + 1], _weight(expert.down_proj))  # [1, hidden]
            out.add_(y * weights[order[i]])  # the one float add per element of index_add_
        return out
