"""GGUF tensor dequantization to float32 torch tensors.

Tensor data is a copy-on-write memory map, so nothing is read until a tensor is dequantized. The
quantization types of the bundled files (and Q4_0) use vectorised torch code, faster than `gguf`'s
numpy dequantizers (benchmarks/LOG.md), which handle the rarer types. This is the dequantization
that needs no compiled kernels (CUDA, `quantization="none"`, types without a kernel); weights kept
quantized are read back by the kernels' own `tandem_q_rows` (kernels/cpu_quant_pack.c).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as np_dequantize

from tandem.loader.gguf_reader import GGUFFile, GGUFTensorInfo

# ---------------------------------------------------------------------------------------------------
# Dequantization. Each torch function maps uint8 blocks [n_blocks, type_size] -> float32 [n_blocks, block]
# in the element order of ggml (and of gguf's numpy reference, which the tests compare against).
# ---------------------------------------------------------------------------------------------------

def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()  # [n, 1]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] packed bytes -> [n, 2k]: all low nibbles, then all high nibbles."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit (scale, min) pairs packed into 12 bytes by the Q4_K/Q5_K formats."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc.float(), mn.float()


def _dq_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].view(torch.int8).float().mul_(_f16(b, 0))


def _dq_q4_0(b: torch.Tensor) -> torch.Tensor:
    return (_nibbles(b[:, 2:]).float() - 8.0).mul_(_f16(b, 0))


def _dq_q4_1(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[:, 4:]).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _dq_q5_0(b: torch.Tensor) -> torch.Tensor:
    qh = b[:, 2:6].contiguous().view(torch.int32)  # [n, 1]; bit j is the fifth bit of element j
    shifts = torch.arange(32, dtype=torch.int32)
    high = ((qh >> shifts) & 1).to(torch.uint8) << 4
    return ((_nibbles(b[:, 6:]) | high).float() - 16.0).mul_(_f16(b, 0))


def _dq_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).unsqueeze(-1)  # [n, 8, 1]
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    qs = b[:, 16:].reshape(n, 4, 1, 32)
    q = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32).float()
    return (q.mul_(d).sub_(dm)).reshape(n, 256)


def _dq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 1, 64)
    ql = torch.cat((ql & 0x0F, ql >> 4), dim=2).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    qh = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=2).reshape(n, 8, 32)
    q = (ql | (qh << 4)).view(torch.int8).float() - 32.0
    d = (_f16(b, 208) * b[:, 192:208].view(torch.int8).float()).reshape(n, 16, 1)
    return q.reshape(n, 16, 16).mul_(d).reshape(n, 256)


_Q = GGMLQuantizationType
_TORCH_DEQUANT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    _Q.Q8_0: _dq_q8_0, _Q.Q4_0: _dq_q4_0, _Q.Q4_1: _dq_q4_1, _Q.Q5_0: _dq_q5_0, _Q.Q4_K: _dq_q4_k,
    _Q.Q6_K: _dq_q6_k,
}
_NUMPY_DEQUANT = {_Q.Q5_1, _Q.Q2_K, _Q.Q3_K, _Q.Q5_K}  # rarer types: gguf's numpy reference is fast enough
_FLOAT_TYPES = {_Q.F32: torch.float32, _Q.F16: torch.float16, _Q.BF16: torch.bfloat16}
SUPPORTED_GGML_TYPES = sorted(_Q(t).name for t in (*_TORCH_DEQUANT, *_NUMPY_DEQUANT, *_FLOAT_TYPES))
_BLOCKS_PER_CHUNK = 1 << 16  # bounds the int8/uint8 temporaries of one step; also keeps them cache-friendly


def _ggml_type_name(ggml_type: int) -> str:
    try:
        return _Q(ggml_type).name
    except ValueError:
        return f"unknown ggml type {ggml_type}"


def dequantize_tensor(gf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor of the file as a new float32 torch tensor of shape `info.shape`."""
    if info.ggml_type not in _FLOAT_TYPES and info.ggml_type not in _TORCH_DEQUANT \
            and info.ggml_type not in _NUMPY_DEQUANT:
        raise ValueError(f"tensor {info.name!r} in {gf.path.name} has quantization type "
                         f"{_ggml_type_name(info.ggml_type)}, which tandem cannot dequantize "
                         f"(supported: {', '.join(SUPPORTED_GGML_TYPES)})")
    with one_thread():
        return _dequantize(gf, info)


def raw_tensor(gf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """The tensor's bytes as uint8 [rows, bytes per row], memory-mapped (nothing read yet)."""
    # mode "c" (copy-on-write) gives a writable array, so torch.from_numpy shares it without a warning
    raw = np.memmap(gf.path, dtype=np.uint8, mode="c", offset=info.start, shape=(info.nbytes,))
    return torch.from_numpy(raw).reshape(math.prod(info.shape[:-1]), -1)


def _dequantize(gf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    return dequantize_blocks(raw_tensor(gf, info), info.ggml_type, info.shape)


def dequantize_blocks(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """uint8 rows [rows, bytes per row] of `ggml_type` -> a new float32 tensor of `shape`."""
    if ggml_type not in _FLOAT_TYPES and ggml_type not in _TORCH_DEQUANT \
            and ggml_type not in _NUMPY_DEQUANT:
        raise ValueError(f"quantization type {_ggml_type_name(ggml_type)} cannot be dequantized "
                         f"(supported: {', '.join(SUPPORTED_GGML_TYPES)})")
    if ggml_type in _FLOAT_TYPES:
        return raw.contiguous().view(_FLOAT_TYPES[ggml_type]).to(torch.float32, copy=True) \
            .reshape(shape)
    if ggml_type in _NUMPY_DEQUANT:
        return torch.from_numpy(np_dequantize(raw.numpy(), _Q(ggml_type))).reshape(shape)
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    blocks = raw.reshape(-1, type_size)
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)
    fn = _TORCH_DEQUANT[ggml_type]
    for i in range(0, blocks.shape[0], _BLOCKS_PER_CHUNK):
        out[i:i + _BLOCKS_PER_CHUNK] = fn(blocks[i:i + _BLOCKS_PER_CHUNK])
    return out.reshape(shape)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Dequantizing is thousands of short memory-bound element-wise ops per file: torch's intra-op
    threads gain little on them, and when the cores are shared each op's barrier waits on a descheduled
    thread (the figures: benchmarks/LOG.md)."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
