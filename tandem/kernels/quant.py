"""The quantized-weight kernels (cpu_quant.c, cpu_quantize.c) from Python: a quantized linear
layer, rows of a quantized table as float32, and float32 rows to blocks.

Unlike the float32 kernels in cpu.py, these have no torch fallback: a model keeps its weights
quantized only where the library is loaded (tandem/layers/quantized.py decides at load), so a
refusal here is an error, never a silent detour.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Optional

import torch

from tandem.kernels import cpu

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PAGE = mmap.PAGESIZE

# ggml type ids (gguf.GGMLQuantizationType) that the kernels multiply as they are.
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13,
                "Q6_K": 14, "F16": 1, "BF16": 30}
# ...and those a float checkpoint can be quantized to at load: the `quantization` values, and
# q6_k, which only the vocabulary tables of a q4_k model take (layers/embedding.py).
QUANTIZE_TYPES = {"q8_0": 8, "q4_0": 2, "q4_k": 12, "q6_k": 14}


def _lib():
    lib = cpu._state["lib"]
    if lib is None:
        raise RuntimeError("the CPU kernel library is not loaded (TANDEM_CPU_KERNELS=torch, or "
                           "it could not be built): quantized weights cannot run")
    return lib


def block_shape(ggml_type: int) -> tuple[int, int]:
    """(elements, bytes) of one block of a kernel type."""
    lib = _lib()
    return lib.tandem_q_block(ggml_type), lib.tandem_q_block_bytes(ggml_type)


def qlinear(x: torch.Tensor, desc: torch.Tensor, bias: Optional[torch.Tensor],
            out_features: int) -> torch.Tensor:
    """x [T, in] float32 @ W^T (+ bias) -> [T, out], W described by `desc` (int64: segment
    count, then per segment ggml type, rows, data address, bytes per row)."""
    x = x.contiguous()
    rows, k = x.shape
    y = x.new_empty(rows, out_features)
    rc = _lib().tandem_qlinear(x.data_ptr(), desc.data_ptr(),
                               None if bias is None else bias.data_ptr(), y.data_ptr(), rows,
                               out_features, k, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"the quantized matmul refused its layout ({rows} x {k} against "
                           f"{out_features} rows)")
    return y


def dequantize_rows(ggml_type: int, data: torch.Tensor, ids: torch.Tensor, k: int,
                    rows: Optional[int] = None, row_bytes: Optional[int] = None) -> torch.Tensor:
    """Rows `ids` [N] of data (uint8 [rows, row bytes]) as float32 [N, k]. With R16 in the
    type, data is interleaved (`pack_r16`: [groups, group bytes]) and `rows`, `row_bytes` say
    the tensor's own."""
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], k, dtype=torch.float32)
    rows = data.shape[0] if rows is None else rows
    row_bytes = data.shape[1] if row_bytes is None else row_bytes
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise IndexError(f"row ids outside [0, {rows})")
    rc = _lib().tandem_q_rows(ggml_type, data.data_ptr(), row_bytes, ids.data_ptr(),
                              ids.shape[0], k, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"ggml type {ggml_type} with {data.shape[1]} bytes per row of {k} "
                           "elements is not a layout the kernels take")
    return out


R16 = 0x100  # in a descriptor's type: rows interleaved 16 at a time (cpu_quant_pack.c)


_SLICE_ROWS = 16 * 256  # rows packed at a time where the source pages are given back


def pack_r16(ggml_type: int, data: torch.Tensor, k: int,
             release_source: bool = False) -> Optional[torch.Tensor]:
    """Rows (uint8 [rows, row bytes]) interleaved 16 at a time, uint8 [ceil(rows / 16), group
    bytes], the layout the kernels multiply; None for a type that is never interleaved (F16,
    BF16: their rows stay as they are). `release_source`: `data` is a clean mapping of a file
    that nothing wrote to (a GGUF tensor), so each slice's pages are given back once it is
    packed; the mapped bytes and their copy then never coexist whole (a whole table's copy
    would add its size to the peak of a load), and a page read again comes from the file."""
    lib = _lib()
    group_bytes = lib.tandem_q_r16_bytes(ggml_type, k)
    if group_bytes == 0:
        return None
    data = data.contiguous()
    rows = data.shape[0]
    out = torch.empty((rows + 15) // 16, group_bytes, dtype=torch.uint8)
    step = _SLICE_ROWS if release_source else max(rows, 1)
    for r0 in range(0, rows, step):
        part = data.narrow(0, r0, min(step, rows - r0))
        rc = lib.tandem_q_r16_pack(ggml_type, part.data_ptr(), part.shape[0], part.shape[1], k,
                                   out[r0 // 16].data_ptr())
        if rc != 0:
            raise RuntimeError(f"ggml type {ggml_type} rows of {k} elements cannot be "
                               "interleaved")
        if release_source:
            _drop_pages(part)
    return out


def _drop_pages(t: torch.Tensor) -> None:
    """madvise(MADV_DONTNEED) over the whole pages inside t's bytes (Linux; elsewhere nothing)."""
    if _libc is None:
        return
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # DONTNEED


def quantize(x: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """x [rows, k] float32 -> uint8 [rows, k / block * block bytes] (Q8_0, Q4_0, Q4_K, Q6_K)."""
    x = x.detach().to(torch.float32).contiguous()
    rows, k = x.shape
    block, nbytes = block_shape(ggml_type)
    if not block or k % block:
        raise ValueError(f"cannot quantize rows of {k} elements to ggml type {ggml_type} "
                         f"(blocks of {block})")
    out = torch.empty(rows, k // block * nbytes, dtype=torch.uint8)
    rc = _lib().tandem_quantize(x.data_ptr(), rows, k, ggml_type, out.data_ptr(),
                                torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"ggml type {ggml_type} is not one tandem quantizes to")
    return out
