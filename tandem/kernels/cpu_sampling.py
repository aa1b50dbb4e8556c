"""The sampler's CPU kernels from Python (cpu_gumbel.c, and cpu_kernels.c's row sum): a greedy
row's argmax, a row's sum in one order, and the Gumbel-max over a row's candidate columns. Each
returns None where the library is off or the layout is not one it reads, and the caller runs
torch's ops (sample/logits_processing.py, sample/gumbel.py)."""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels.cpu import _ok, _ptr, _state


def argmax(scores: torch.Tensor) -> Optional[torch.Tensor]:
    """scores [B, V] float32 -> [B] int64, each row's first maximal column (its first NaN where
    it has one: torch.argmax's choice) by cpu_gumbel.c; None where the library is off or the
    layout is not one it reads."""
    lib = _state["lib"]
    if lib is None or scores.dim() != 2 or not _ok(scores) or scores.shape[1] == 0:
        return None
    out = torch.empty(scores.shape[0], dtype=torch.int64)
    lib.tandem_argmax(scores.data_ptr(), scores.shape[0], scores.shape[1], out.data_ptr(),
                      torch.get_num_threads())
    return out


def row_sum(x: torch.Tensor) -> Optional[torch.Tensor]:
    """x [B, V] float32 -> [B, 1], each row summed in one fixed order (cpu_kernels.c), so its
    bits never depend on the batch (torch's sum splits a lone row over the threads); None where
    the library is off or the layout is not one it reads."""
    lib = _state["lib"]
    if lib is None or x.dim() != 2 or not _ok(x):
        return None
    out = torch.empty(x.shape[0], 1)
    lib.tandem_row_sum(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr(),
                       torch.get_num_threads())
    return out


def gumbel_candidates(probs: torch.Tensor, keys: torch.Tensor, token_ids: Optional[torch.Tensor]
                      ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The columns of each row of probs [B, V] float32 that can win its Gumbel-max
    (cpu_gumbel.c): (start [B + 1], cols [C]) int64, row r's candidates start[r] ..
    start[r + 1] - 1 in column order; None where the library is off or the layout is not one it
    reads."""
    lib = _state["lib"]
    if (lib is None or probs.dim() != 2 or not _ok(probs) or keys.dtype is not torch.int64
            or not keys.is_contiguous() or (token_ids is not None and (
                token_ids.dtype is not torch.int64 or not token_ids.is_contiguous()))):
        return None
    start = torch.empty(probs.shape[0] + 1, dtype=torch.int64)
    cols = torch.empty(probs.numel(), dtype=torch.int64)  # room for every column (untouched)
    lib.tandem_gumbel_candidates(probs.data_ptr(), probs.shape[0], probs.shape[1],
                                 keys.data_ptr(), _ptr(token_ids), start.data_ptr(),
                                 cols.data_ptr())
    return start, cols[:int(start[-1])]


def gumbel_argmax_sparse(scores: torch.Tensor, start: torch.Tensor, ids: torch.Tensor,
                         cols: torch.Tensor, keys: torch.Tensor) -> Optional[torch.Tensor]:
    """gumbel_argmax over each row's candidates only (cpu_gumbel.c): scores [C] float32, start
    [B + 1], ids [C] and cols [C] int64 (row r's candidates start[r] .. start[r + 1] - 1, in
    column order), keys [B] int64 -> [B] int64 columns; None where the library is off."""
    lib = _state["lib"]
    if lib is None or not _ok(scores) or not all(
            t.dtype is torch.int64 and t.is_contiguous() and t.is_cpu
            for t in (start, ids, cols, keys)):
        return None
    out = torch.empty(keys.shape[0], dtype=torch.int64)
    lib.tandem_gumbel_argmax_sparse(scores.data_ptr(), start.data_ptr(), ids.data_ptr(),
                                    cols.data_ptr(), keys.shape[0], keys.data_ptr(),
                                    out.data_ptr(), torch.get_num_threads())
    return out
