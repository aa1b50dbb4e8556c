"""Token embedding and LM head (tied or separate), both split over the vocabulary across
tensor-parallel ranks: rank r holds rows r * per_rank ... (r + 1) * per_rank - 1 (the last shard
padded with zero rows when the vocabulary does not divide evenly)."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from tandem.distributed.parallel_state import current_group
from tandem.kernels.quant import QUANTIZE_TYPES
from tandem.layers.linear import linear, make_weight
from tandem.layers.quantized import build_mode, quantized_build


def vocab_shard(module: nn.Module, vocab_size: int, hidden: int) -> nn.Parameter:
    """This rank's [per_rank, hidden] rows of a vocabulary-sized matrix, with a loader that
    copies them out of the full checkpoint tensor. Quantized at load, the tables take Q8_0, or
    Q6_K in a q4_k model (llama.cpp's Q4_K_M keeps its output there): the LM head's logits are
    what sampling reads, so they stay above 4 bits. In the 8B shapes Q6_K holds the LM head in
    510 MB instead of Q8_0's 661 (and a 0.6B draft's tied table in 128 instead of 165)."""
    group = current_group()
    per_rank = -(-vocab_size // group.size)
    start = group.rank * per_rank
    module.row_offset = lambda shard_id=None: 0
    mode = build_mode()
    table = "q6_k" if mode == "q4_k" else "q8_0"
    with quantized_build(table if mode in QUANTIZE_TYPES else mode):
        param = make_weight(module, per_rank, hidden)
    if build_mode() is not None:
        return param  # one rank: the whole table, through param.quant_loader

    def load(p: nn.Parameter, loaded: torch.Tensor,
             shard_id: Optional[Union[int, str]] = None) -> None:
        rows = loaded[start:start + per_rank]
        p.data[:rows.shape[0]].copy_(rows)
        p.data[rows.shape[0]:].zero_()

    param.weight_loader = load
    return param


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, scale: float = 1.0) -> None:
        super().__init__()
        self.group = current_group()
        self.per_rank = -(-vocab_size // self.group.size)
        self.start = self.group.rank * self.per_rank
        self.weight = vocab_shard(self, vocab_size, hidden)
        self.scale = scale  # Gemma multiplies embeddings by sqrt(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        if self.qweight is not None:  # only the rows looked up are dequantized
            x = self.qweight.rows(ids)
        elif self.group.size == 1:
            x = F.embedding(ids, self.weight)
        else:
            local = ids - self.start
            inside = (local >= 0) & (local < self.per_rank)               # [T]
            x = F.embedding(local.clamp(0, self.per_rank - 1), self.weight)
            x = self.group.all_reduce(x * inside.unsqueeze(1).to(x.dtype))  # one rank has each
        if self.scale != 1.0:
            # Gemma rounds the scale to the model dtype before multiplying.
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, tied_to: Embedding | None = None) -> None:
        super().__init__()
        self.group = current_group()
        self.vocab_size = vocab_size
        self.tied_to = tied_to
        if tied_to is None:
            self.weight = vocab_shard(self, vocab_size, hidden)
        # A copy of the (tied) weight in another dtype for the matmul only, when the CPU matmul
        # mode keeps linear weights in bfloat16 (layers/cpu_matmul_weights.py); the embedding
        # lookup keeps the float32 rows.
        self.matmul_weight: Optional[torch.Tensor] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        owner = self.tied_to if self.tied_to is not None else self
        w = owner.qweight if owner.qweight is not None else owner.weight
        if self.matmul_weight is not None:
            w = self.matmul_weight
        logits = linear(hidden, w)                           # [N, vocab / tp]
        if self.group.size == 1:
            return logits
        if logits.shape[0] == 0:  # every rank runs the same batch, so all skip the gather
            return logits.new_zeros(0, self.vocab_size)
        return self.group.all_gather(logits, dim=-1)[:, :self.vocab_size]
