"""Weights kept quantized: GGUF blocks multiplied as they are (kernels/cpu_quant.c).

A linear layer (or the embedding table) built inside `quantized_build(mode)` allocates no float
weight (its parameter lives on the meta device, for its shape only) and collects what the
checkpoint gives it row range by row range (q, k and v each land in their rows of the fused
projection): a file's blocks (`RawQuant`, from loader/gguf_loader.py) or float rows that it
quantizes itself (`q8_0`, `q4_0`, `q4_k`). Once loaded, `finish_quantized` turns each layer's
parts into one `QuantizedWeight`: segments of rows, each of one ggml type, in output order (a
Q4_K_M file mixes Q5_0 q/k with Q8_0 v in one projection), a block type's interleaved 16 rows at
a time (`PackedQuant`, the layout every kernel build reads), F16/BF16 kept in GGUF's rows. A
part of a type without a kernel (Q2_K, Q3_K, ...) makes that layer float32 instead: its parts
are dequantized, counted, and named in one log line.

Rows are independent in every block format, so row ranges, llama.cpp's q/k row permutation and
tied embeddings all work on the blocks directly. Tensor parallelism splits columns too, across
block boundaries, so quantized weights run at one rank only (config.py decides).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import torch
from torch import nn

from tandem.kernels import quant

logger = logging.getLogger("tandem")

_GGML_NAMES = {v: k for k, v in quant.KERNEL_TYPES.items()}
_mode: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("quantized_build",
                                                                     default=None)


@contextlib.contextmanager
def quantized_build(mode: Optional[str]) -> Iterator[None]:
    """Layers built inside keep their weights quantized: mode "gguf" (the file's own blocks),
    "q8_0", "q4_0", "q4_k" or "q6_k" (float rows quantized at load); None: float weights."""
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def build_mode() -> Optional[str]:
    return _mode.get()


@dataclass
class RawQuant:
    """Rows of a GGUF tensor in its blocks: data uint8 [rows, bytes per row] of `ggml_type`.
    `mapped`: data is the file's own mapping, never written (its pages may be given back)."""
    ggml_type: int
    data: torch.Tensor
    cols: int
    type_name: str
    mapped: bool = False

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def take_rows(self, index: torch.Tensor) -> RawQuant:
        return RawQuant(self.ggml_type, self.data[index], self.cols, self.type_name)

    def narrow(self, start: int, length: int) -> RawQuant:
        return RawQuant(self.ggml_type, self.data.narrow(0, start, length), self.cols,
                        self.type_name, self.mapped)

    @property
    def has_kernel(self) -> bool:
        return self.ggml_type in _GGML_NAMES

    def dequantize(self) -> torch.Tensor:
        """[rows, cols] float32 (exact)."""
        if self.has_kernel:
            return quant.dequantize_rows(self.ggml_type, self.data.contiguous(),
                                         torch.arange(self.rows), self.cols)
        from tandem.loader.gguf_dequant import dequantize_blocks
        return dequantize_blocks(self.data, self.ggml_type, (self.rows, self.cols))


@dataclass
class PackedQuant:
    """Rows of a GGUF tensor interleaved 16 at a time (kernels/cpu_quant_pack.c): the same
    bytes reordered so that one integer multiply-add serves 16 rows. data uint8 [ceil(rows /
    16), group bytes]; row_bytes is a row's size in its own blocks."""
    ggml_type: int
    data: torch.Tensor
    rows: int
    cols: int
    type_name: str
    row_bytes: int

    def values(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [N] as float32 [N, cols]: the values of the rows before interleaving."""
        return quant.dequantize_rows(self.ggml_type | quant.R16, self.data, ids, self.cols,
                                     self.rows, self.row_bytes)

    def dequantize(self) -> torch.Tensor:
        return self.values(torch.arange(self.rows))


Segment = Union[RawQuant, PackedQuant]
LAYOUT = "interleaved"


def _check_layout() -> None:
    """TANDEM_QUANT_LAYOUT: "interleaved", the one layout (every kernel build reads it); "rows",
    GGUF's own order, is retired, and it or any other value is refused."""
    layout = os.environ.get("TANDEM_QUANT_LAYOUT", LAYOUT).strip() or LAYOUT
    if layout != LAYOUT:
        raise ValueError(f"TANDEM_QUANT_LAYOUT={layout!r} is not supported: quantized weights "
                         f"are always interleaved 16 rows at a time (the one value is "
                         f"{LAYOUT!r}; GGUF's row order, 'rows', is retired). Unset it.")


def _packed(s: Segment) -> Segment:
    """Blocks interleaved 16 rows at a time; F16/BF16 rows stay in GGUF's order."""
    if isinstance(s, PackedQuant):
        return s
    data = quant.pack_r16(s.ggml_type, s.data, s.cols, release_source=s.mapped)
    if data is None:
        return RawQuant(s.ggml_type, s.data.contiguous(), s.cols, s.type_name)
    return PackedQuant(s.ggml_type, data, s.rows, s.cols, s.type_name, s.data.shape[1])


class QuantizedWeight:
    """A [out, in] weight as row segments of ggml blocks, and the descriptor the kernels read."""

    def __init__(self, segments: list[Segment]) -> None:
        _check_layout()
        self.segments = [_packed(s) for s in segments]
        self.shape = (sum(s.rows for s in segments), segments[0].cols)
        flat = [len(self.segments)]
        for s in self.segments:
            if isinstance(s, PackedQuant):
                flat += [s.ggml_type | quant.R16, s.rows, s.data.data_ptr(), s.row_bytes]
            else:
                flat += [s.ggml_type, s.rows, s.data.data_ptr(), s.data.shape[1]]
        self.desc = torch.tensor(flat, dtype=torch.int64)  # [1 + 4 * segments]

    @property
    def nbytes(self) -> int:
        return sum(s.data.numel() for s in self.segments)

    @property
    def types(self) -> list[str]:
        return [s.type_name for s in self.segments]

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x [T, in] float32 on the CPU -> [T, out]."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
            raise RuntimeError(f"quantized weights multiply 2-D float32 CPU inputs, got "
                               f"{x.dtype} {tuple(x.shape)} on {x.device}")
        return quant.qlinear(x, self.desc, bias, self.shape[0])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] as float32 [T, in]: an embedding lookup reads only these rows."""
        if len(self.segments) == 1:
            s = self.segments[0]
            if isinstance(s, PackedQuant):
                return s.values(ids)
            return quant.dequantize_rows(s.ggml_type, s.data, ids, s.cols)
        return self.dequantize()[ids]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([s.dequantize() for s in self.segments])


Part = Union[RawQuant, torch.Tensor]


@dataclass
class QuantParts:
    """What the checkpoint gave a quantized layer so far: row offset -> rows."""
    mode: str
    shape: tuple[int, int]
    parts: dict[int, Part] = field(default_factory=dict)

    def add(self, offset: int, part: Part) -> None:
        if isinstance(part, torch.Tensor) and self.mode in quant.QUANTIZE_TYPES:
            part = quantize_rows(part, self.mode)
        self.parts[offset] = part

    def finish(self) -> Union[QuantizedWeight, torch.Tensor]:
        rows = sum(p.shape[0] if isinstance(p, torch.Tensor) else p.rows
                   for p in self.parts.values())
        if rows != self.shape[0]:
            raise ValueError(f"a quantized weight of {self.shape[0]} rows got {rows} from the "
                             "checkpoint")
        ordered = [self.parts[o] for o in sorted(self.parts)]
        if all(isinstance(p, RawQuant) and p.has_kernel for p in ordered):
            return QuantizedWeight(_merge(ordered))
        return torch.cat([p.dequantize() if isinstance(p, RawQuant) else p.float()
                          for p in ordered])


def _merge(parts: list[RawQuant]) -> list[RawQuant]:
    """Neighbouring parts of one type become one segment."""
    merged: list[RawQuant] = []
    for p in parts:
        if merged and merged[-1].ggml_type == p.ggml_type:
            last = merged[-1]
            merged[-1] = RawQuant(p.ggml_type, torch.cat((last.data, p.data)), p.cols, p.type_name)
        else:
            merged.append(p)
    return merged


_fallbacks_logged: set[tuple[str, int]] = set()


def quantize_rows(rows: torch.Tensor, mode: str) -> Union[RawQuant, torch.Tensor]:
    """Float rows [r, k] -> blocks of `mode` (q8_0, q4_0, q4_k, q6_k). K-quants need rows of a
    multiple of 256 elements: shorter ones take Q4_0 (Q8_0 for Q6_K; logged once per width), as
    llama.cpp falls back for such tensors."""
    cols = rows.shape[1]
    name = mode
    if mode in ("q4_k", "q6_k") and cols % 256:
        name = "q4_0" if mode == "q4_k" else "q8_0"
        if (mode, cols) not in _fallbacks_logged:
            _fallbacks_logged.add((mode, cols))
            what = ("quantization=q4_k" if mode == "q4_k"
                    else "a q4_k model's vocabulary table (Q6_K)")
            logger.info("%s: rows of %d elements are not a multiple of 256; they take %s "
                        "instead", what, cols, name.upper())
    if cols % 32:
        return rows.float()  # no block format divides it: stays float32 (counted at finish)
    ggml_type = quant.QUANTIZE_TYPES[name]
    return RawQuant(ggml_type, quant.quantize(rows, ggml_type), cols, name.upper())


def finish_quantized(model: nn.Module) -> None:
    """Every quantized layer's parts -> its weight, with one log line for the types kept and
    one per reason a layer runs in float32 instead (a type without a kernel, float rows)."""
    kept: Counter[str] = Counter()
    floated: Counter[str] = Counter()
    nbytes = 0
    for module in model.modules():
        parts: Optional[QuantParts] = getattr(module, "quant_parts", None)
        if parts is None:
            continue
        no_kernel = sorted({p.type_name for p in parts.parts.values()
                            if isinstance(p, RawQuant) and not p.has_kernel})
        done = parts.finish()
        module.quant_parts = None
        if isinstance(done, QuantizedWeight):
            module.qweight = done
            nbytes += done.nbytes
            kept.update(done.types)
        else:
            module.weight = nn.Parameter(done, requires_grad=False)
            floated[", ".join(no_kernel) or "float32 in the checkpoint"] += 1
    if kept:
        logger.info("quantized weights: segments kept as they are %s (%.1f MB)",
                    dict(sorted(kept.items())), nbytes / 1e6)
    for why, count in sorted(floated.items()):
        logger.info("quantized weights: %d layer(s) dequantized to float32 at load (%s: no "
                    "quantized kernel)", count, why)


def is_quantized(module: nn.Module) -> bool:
    return getattr(module, "qweight", None) is not None
