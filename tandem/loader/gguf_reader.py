"""GGUF header reader: metadata and the tensor directory of a llama.cpp single-file model.

We parse the header ourselves instead of using `gguf.GGUFReader`: the reader builds a Python object per
vocabulary entry, which costs ~1.6 s for SmolLM2 and ~7.6 s for Gemma 3's 262k-token vocabulary, while
skipping those arrays costs ~0.1 s.

Every count, length and offset in the header is checked against what is left of the file before it is
used, so a truncated or corrupt file is a `GGUFError` (a ValueError) naming the file and the field.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from gguf import GGML_QUANT_SIZES

# ---------------------------------------------------------------------------------------------------
# Header parsing
# ---------------------------------------------------------------------------------------------------

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_SCALARS = {vtype: struct.Struct(fmt) for vtype, fmt in _SCALAR_FORMATS.items()}
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_U32, _U64, _TYPE_AND_LENGTH = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<IQ")
_DIMS = [struct.Struct(f"<{n}Q") for n in range(5)]
_VERSIONS = (2, 3)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_INT64_MAX = 2**63 - 1  # ggml counts elements in int64
_DEFAULT_ALIGNMENT = 32
# The fewest bytes one entry can take: a count that cannot fit in what is left of the file is refused
# before any loop or allocation it would drive.
_KV_MIN_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
_TENSOR_MIN_BYTES = 8 + 4 + 4 + 8  # name length, ndim (0), type, data offset
# Large string arrays we never need ourselves (the tokenizer is built by transformers): keep only the count.
_SKIPPED_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


class GGUFError(ValueError):
    """A file that is not GGUF or whose header is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (the file stores the fastest-moving dimension first)
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key, e.g. get("block_count") reads "llama.block_count"."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class _Cursor:
    """A read position in the mapped file. Every read is checked against the end of the file and names its
    field, so a corrupt count, length or truncation fails there, by name, instead of crashing later,
    allocating from a garbage count, or copying the rest of a multi-GB file."""

    def __init__(self, path: str, buf: memoryview) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, len(buf), 0

    def fail(self, detail: str) -> NoReturn:
        raise GGUFError(f"{self.path} is not a valid GGUF file: {detail}")

    def left(self) -> int:
        return self.size - self.pos

    def skip(self, n: int, field: str) -> int:
        """Steps over the n bytes of `field`; returns where they start."""
        if n > self.size - self.pos:
            self.fail(f"{field} needs {n} bytes at byte {self.pos}, but the file ends at byte {self.size}")
        self.pos += n
        return self.pos - n

    def unpack(self, fmt: struct.Struct, field: str) -> tuple[Any, ...]:
        return fmt.unpack_from(self.buf, self.skip(fmt.size, field))

    def string(self, field: str) -> str:
        (length,) = self.unpack(_U64, f"the string length of {field}")
        if length > self.left():
            self.fail(f"the string length of {field} is {length}, more than the {self.left()} bytes left "
                      f"in the file after byte {self.pos}")
        start = self.skip(length, field)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def count(self, n: int, field: str, min_bytes: int, what: str) -> int:
        if n * min_bytes > self.left():
            self.fail(f"{field} = {n}, but {n} {what} of at least {min_bytes} bytes each cannot fit in the "
                      f"{self.left()} bytes left in the file after byte {self.pos}")
        return n


def _skip_strings(cur: _Cursor, count: int, key: str) -> None:
    """Steps over `count` strings without decoding them (walking the lengths is the only way past); one
    comparison per entry keeps a corrupt length from walking off the end of the file."""
    buf, pos, last, unpack = cur.buf, cur.pos, cur.size - 8, _U64.unpack_from
    for i in range(count):
        if pos > last:
            _skipped_past_end(cur, pos, i, key)
        pos += 8 + unpack(buf, pos)[0]
    if pos > cur.size:
        _skipped_past_end(cur, pos, count, key)
    cur.pos = pos


def _skipped_past_end(cur: _Cursor, pos: int, i: int, key: str) -> NoReturn:
    if pos > cur.size:  # the previous entry's length ran past the end
        cur.fail(f"the string length of item {i - 1} of key {key!r} runs to byte {pos}, past the end "
                 f"of the file ({cur.size} bytes)")
    cur.fail(f"the string length of item {i} of key {key!r} needs 8 bytes at byte {pos}, but the file "
             f"ends at byte {cur.size}")


def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype], f"the value of key {key!r}")[0]
    if vtype == _STRING:
        return cur.string(f"the value of key {key!r}")
    if vtype != _ARRAY:
        cur.fail(f"metadata key {key!r} has unknown value type {vtype} (known: 0 to 12)")
    item_type, count = cur.unpack(_TYPE_AND_LENGTH, f"the array type and length of key {key!r}")
    field = f"the array length of key {key!r}"
    if item_type in _NUMPY_DTYPES:
        dtype = np.dtype(_NUMPY_DTYPES[item_type])
        cur.count(count, field, dtype.itemsize, "items")
        start = cur.skip(count * dtype.itemsize, field)
        return np.frombuffer(cur.buf, dtype=dtype, count=count, offset=start)
    if item_type == _STRING:
        cur.count(count, field, 8, "strings")
        if key in _SKIPPED_STRING_ARRAYS:
            _skip_strings(cur, count, key)
            return count
        return [cur.string(f"item {i} of key {key!r}") for i in range(count)]
    cur.fail(f"metadata key {key!r} is an array of unsupported type {item_type}")


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}'s name")
        if key in metadata:  # the later value would silently replace the earlier one
            cur.fail(f"duplicate metadata key {key!r} (key #{i} repeats an earlier one)")
        (vtype,) = cur.unpack(_U32, f"the value type of key {key!r}")
        metadata[key] = _read_value(cur, vtype, key)
    return metadata


def _alignment(cur: _Cursor, metadata: dict[str, Any]) -> int:
    value = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        cur.fail(f"general.alignment = {repr(value):.80}; it must be a power of two "
                 f"(the default is {_DEFAULT_ALIGNMENT})")
    return value


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    infos, seen = [], {}
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i}'s name")
        if name in seen:  # the later entry would silently replace the earlier one
            cur.fail(f"duplicate tensor name {name!r} (tensors #{seen[name]} and #{i})")
        seen[name] = i
        (ndim,) = cur.unpack(_U32, f"tensor {name!r}'s ndim")
        if ndim > _MAX_DIMS:
            cur.fail(f"tensor {name!r} has ndim = {ndim}; ggml allows 0 to {_MAX_DIMS} dimensions")
        dims = cur.unpack(_DIMS[ndim], f"tensor {name!r}'s {ndim} dimensions")
        ggml_type, offset = cur.unpack(_TYPE_AND_LENGTH, f"tensor {name!r}'s type and data offset")
        infos.append((name, dims, ggml_type, offset))
    return infos


def _place_tensors(cur: _Cursor, infos: list[tuple[str, tuple[int, ...], int, int]],
                   alignment: int) -> dict[str, GGUFTensorInfo]:
    """Each tensor's bytes in the file, refused by name where its size or offset cannot be right."""
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        n_elements = math.prod(dims)
        if n_elements > _INT64_MAX:
            cur.fail(f"tensor {name!r} has dimensions {list(dims)}: more elements than ggml's int64 holds")
        block, type_size = GGML_QUANT_SIZES.get(ggml_type, (1, 0))  # unknown types fail at dequantization
        if (dims[0] if dims else 1) % block:
            cur.fail(f"tensor {name!r} has rows of {dims[0] if dims else 1} elements, not a multiple of "
                     f"its type's block of {block}")
        if offset % alignment:
            cur.fail(f"tensor {name!r} has data offset {offset}, not a multiple of general.alignment "
                     f"({alignment})")
        start, nbytes = data_start + offset, n_elements // block * type_size
        if start + nbytes > cur.size:  # an interrupted download, or a corrupt offset or shape
            raise GGUFError(f"{cur.path} is truncated: tensor {name!r} ends at byte {start + nbytes} (data "
                            f"offset {offset}, {nbytes} bytes), but the file has {cur.size} bytes. "
                            "Download it again.")
        tensors[name] = GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes)
    return tensors


def _parse(path: str, buf: memoryview) -> GGUFFile:
    if bytes(buf[:4]) != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (bad magic bytes)")
    cur = _Cursor(path, buf)
    cur.pos = 4
    (version,) = cur.unpack(_U32, "version")
    if version not in _VERSIONS:
        swapped = " (it looks big-endian, which tandem does not read)" if (
            int.from_bytes(version.to_bytes(4, "little"), "big") in _VERSIONS) else ""
        cur.fail(f"version = {version}{swapped}; tandem reads GGUF versions 2 and 3")
    (n_tensors,) = cur.unpack(_U64, "n_tensors")
    (n_kv,) = cur.unpack(_U64, "n_kv")
    cur.count(n_kv, "n_kv", _KV_MIN_BYTES, "key/value pairs")
    cur.count(n_tensors, "n_tensors", _TENSOR_MIN_BYTES, "tensor infos")
    metadata = _read_metadata(cur, n_kv)
    alignment = _alignment(cur, metadata)
    cur.count(n_tensors, "n_tensors", _TENSOR_MIN_BYTES, "tensor infos")  # again, past the metadata
    tensors = _place_tensors(cur, _read_tensor_infos(cur, n_tensors), alignment)
    if "general.architecture" not in metadata:
        raise GGUFError(f"{path} has no general.architecture in its metadata")
    return GGUFFile(Path(path), metadata, tensors)


@functools.lru_cache(maxsize=4)
def _read_gguf_cached(path: str, _mtime_ns: int, size: int) -> GGUFFile:
    # np.memmap refuses an empty file; an empty buffer fails the magic check instead
    buf = memoryview(np.memmap(path, dtype=np.uint8, mode="r")) if size else memoryview(b"")
    try:
        return _parse(path, buf)
    except GGUFError:
        raise
    except (struct.error, UnicodeDecodeError, OverflowError, ValueError) as exc:
        # a malformation no check above catches: still an error naming the file
        raise GGUFError(f"{path} is not a valid GGUF file: {exc}") from exc


def read_gguf(path: str | Path) -> GGUFFile:
    """Metadata and tensor directory of a GGUF file (cached per path, mtime and size)."""
    resolved = os.path.realpath(path)
    st = os.stat(resolved)
    return _read_gguf_cached(resolved, st.st_mtime_ns, st.st_size)
