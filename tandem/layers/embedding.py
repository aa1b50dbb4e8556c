"""Token embedding and LM head (tied or separate)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.layers.linear import linear


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden), requires_grad=False)
        self.scale = scale  # Gemma multiplies embeddings by sqrt(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        x = F.embedding(ids, self.weight)
        if self.scale != 1.0:
            # Gemma rounds the scale to the model dtype before multiplying.
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, tied_to: Embedding | None = None) -> None:
        super().__init__()
        self.tied_to = tied_to
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        w = self.tied_to.weight if self.tied_to is not None else self.weight
        return linear(hidden, w)
