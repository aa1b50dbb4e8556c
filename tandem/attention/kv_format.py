"""How a KV cache stores its rows: `kv_cache_dtype` (vLLM's values, and llama.cpp's q8_0).

A cache row is one token's keys (or values) for one KV head: D numbers. Stored as
- "float32" / "bfloat16" / "float16": D numbers of that type ("auto" is the model's dtype);
- "fp8_e4m3" ("fp8", vLLM's default fp8) / "fp8_e5m2": D bytes, torch's float8 types (e4m3
  saturates at +-448; no scale: keys and values of the models here stay far below it);
- "q8_0": llama.cpp's block: for each 32 numbers a float16 scale d = max|x| / 127 and 32 int8
  q = round(x / d) (ties to even), 34 bytes per 32 (D must be a multiple of 32).
The cache tensors are [num_slots, Hkv, row_elems] of `storage`; the C kernels (kernels/kv_format.h)
write and read every format in registers, and `store`/`load` here are the same arithmetic in
torch (the reference path, and the tests' reference), bit for bit. Against a q8_0 cache the
CPU kernel quantizes each query per 32 numbers (a float32 scale, int16 numbers) and takes the
scores as exact integer dot products with the keys' int8 numbers (kernels/attention_q8.h);
`query` gives the query it so multiplies, and the reference path multiplies the same.

Why q8_0 for the 8-bit integer form: llama.cpp's name and layout (`-ctk q8_0`), which users
comparing the two engines already know, and a scale per 32 numbers, which follows a row's
outliers closely (vLLM has no integer KV cache to take a name from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2",
                   "q8_0")
_ALIASES = {"fp8": "fp8_e4m3"}
Q8_BLOCK = 32  # numbers per q8_0 block
Q8_BYTES = 34  # a block: float16 scale, 32 int8


@dataclass(frozen=True)
class KVFormat:
    name: str              # float32, bfloat16, float16, fp8_e4m3, fp8_e5m2 or q8_0
    code: int              # the C kernels' kv_type (kernels/kv_format.h)
    storage: torch.dtype   # the cache tensors' dtype

    def row_elems(self, head_dim: int) -> int:
        """Elements of `storage` a cache row of head_dim numbers takes."""
        return head_dim // Q8_BLOCK * Q8_BYTES if self.name == "q8_0" else head_dim

    def row_bytes(self, head_dim: int) -> int:
        return self.row_elems(head_dim) * torch.tensor([], dtype=self.storage).element_size()

    def store(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] float -> [..., row_elems] rows of this format."""
        if self.name != "q8_0":
            return x.to(self.storage)
        blocks = x.float().reshape(*x.shape[:-1], -1, Q8_BLOCK)            # [..., D/32, 32]
        amax = blocks.abs().amax(-1, keepdim=True)                          # [..., D/32, 1]
        d = (amax / 127).to(torch.float16)                                  # the stored scale
        inv = torch.where(d.float() > 0, 1.0 / d.float(), torch.zeros_like(amax))
        q = torch.round(blocks * inv).clamp_(-127, 127).to(torch.int8)     # ties to even
        out = torch.cat((d.view(torch.uint8), q.view(torch.uint8)), -1)    # [..., D/32, 34]
        return out.reshape(*x.shape[:-1], -1)

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """q [..., D] -> the query the kernels' scores multiply: q itself, or against q8_0 its
        blocks of 32 quantized (dq = max|q| / 32767 in float32, int16 round(q / dq), ties to
        even) and multiplied back, in float64 (exact)."""
        if self.name != "q8_0":
            return q
        blocks = q.float().reshape(*q.shape[:-1], -1, Q8_BLOCK)            # [..., D/32, 32]
        dq = blocks.abs().amax(-1, keepdim=True) / 32767                     # [..., D/32, 1]
        inv = torch.where(dq > 0, 1.0 / dq, torch.zeros_like(dq))
        qi = torch.round(blocks * inv).clamp_(-32767, 32767)
        return (qi.double() * dq.double()).reshape(q.shape)

    def load(self, rows: torch.Tensor) -> torch.Tensor:
        """[..., row_elems] rows of this format -> [..., D] float32."""
        if self.name != "q8_0":
            return rows.float()
        blocks = rows.reshape(*rows.shape[:-1], -1, Q8_BYTES)               # [..., D/32, 34]
        d = blocks[..., :2].contiguous().view(torch.float16).float()        # [..., D/32, 1]
        q = blocks[..., 2:].contiguous().view(torch.int8).float()           # [..., D/32, 32]
        return (q * d).reshape(*rows.shape[:-1], -1)


FORMATS = {f.name: f for f in (
    KVFormat("float32", 0, torch.float32), KVFormat("bfloat16", 1, torch.bfloat16),
    KVFormat("float16", 2, torch.float16), KVFormat("fp8_e4m3", 3, torch.float8_e4m3fn),
    KVFormat("fp8_e5m2", 4, torch.float8_e5m2), KVFormat("q8_0", 5, torch.uint8))}
_BY_STORAGE = {f.storage: f for f in FORMATS.values()}


def format_of(cache: torch.Tensor) -> KVFormat:
    """The format of a bound cache tensor, by its dtype (each format has its own)."""
    return _BY_STORAGE[cache.dtype]


def check_kv_cache_dtype(value: object, key: str = "kv_cache_dtype") -> str:
    """A kv_cache_dtype setting, validated: the error names the key and the allowed values."""
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise ValueError(f"{key}={value!r} is not supported; choose one of "
                         f"{list(KV_CACHE_DTYPES)}.")
    return value


def resolve(value: str, model_dtype: torch.dtype, device: torch.device,
            key: str = "kv_cache_dtype") -> KVFormat:
    """The format of a validated setting for a model of `model_dtype` on `device`. "auto": the
    model's dtype, except a float32 model on the CPU, whose cache is float16 (as llama.cpp's
    default): half the bytes, faster at depth, and top-1 equal to a float32 cache on both
    bundled models (docs/performance.md)."""
    if value == "auto":
        if model_dtype == torch.float32 and device.type == "cpu":
            return FORMATS["float16"]
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if model_dtype not in names:
            raise ValueError(f"{key}='auto' keeps the model's dtype, and {model_dtype} is not "
                             f"one a KV cache takes; choose one of {list(KV_CACHE_DTYPES)}.")
        return FORMATS[names[model_dtype]]
    return FORMATS[_ALIASES.get(value, value)]
