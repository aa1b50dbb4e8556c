"""The quantized-weight kernels (cpu_quant.c, cpu_quantize.c) from Python: a quantized linear
layer, rows of a quantized table as float32, and float32 rows to blocks.

Unlike the float32 kernels in cpu.py, these have no torch fallback: a model keeps its weights
quantized only where the library is loaded (tandem/layers/quantized.py decides at load), so a
refusal here is an error, never a silent detour.
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.kernels import cpu

# ggml type ids (gguf.GGMLQuantizationType) that the kernels multiply as they are.
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13,
                "Q6_K": 14, "F16": 1, "BF16": 30}
# ...and those a float checkpoint can be quantized to at load (the `quantization` values).
QUANTIZE_TYPES = {"q8_0": 8, "q4_0": 2, "q4_k": 12}


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


def dequantize_rows(ggml_type: int, data: torch.Tensor, ids: torch.Tensor,
                    k: int) -> torch.Tensor:
    """Rows `ids` [N] of data (uint8 [rows, row bytes]) as float32 [N, k]."""
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], k, dtype=torch.float32)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= data.shape[0]):
        raise IndexError(f"row ids outside [0, {data.shape[0]})")
    rc = _lib().tandem_q_rows(ggml_type, data.data_ptr(), data.shape[1], ids.data_ptr(),
                              ids.shape[0], k, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"ggml type {ggml_type} with {data.shape[1]} bytes per row of {k} "
                           "elements is not a layout the kernels take")
    return out


def quantize(x: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """x [rows, k] float32 -> uint8 [rows, k / block * block bytes] (Q8_0, Q4_0 or Q4_K)."""
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
