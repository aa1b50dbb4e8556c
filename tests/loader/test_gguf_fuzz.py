"""The GGUF header reader against malformed files: every targeted corruption (absurd counts and lengths,
bad alignment, ndim, duplicates, versions, tensors past the end) is a GGUFError naming the file and the
field; then the bundled SmolLM2 header, truncated at many offsets, with targeted fields overwritten and
with random bytes flipped (fixed seed), either parses or gives such an error, never a crash."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Callable

import gguf
import pytest

from tandem.loader import gguf_reader
from tandem.loader.gguf_reader import GGUFError, GGUFFile, read_gguf

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_F32, _Q4_0 = 0, 2

# ------------------------------------------------------------------------------------------------
# A small GGUF builder with every field under the test's control
# ------------------------------------------------------------------------------------------------


def _str(s: str) -> bytes:
    raw = s.encode()
    return _U64.pack(len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _str(key) + _U32.pack(4) + _U32.pack(value)


def _kv_str(key: str, value: str) -> bytes:
    return _str(key) + _U32.pack(8) + _str(value)


def _kv_strings(key: str, values: list[str]) -> bytes:
    return _str(key) + _U32.pack(9) + _U32.pack(8) + _U64.pack(len(values)) + b"".join(map(_str, values))


def _tensor(name: str, dims: tuple[int, ...], ggml_type: int = _F32, offset: int = 0,
            ndim: int | None = None) -> bytes:
    """A tensor info; dims in file order (fastest-moving first)."""
    return (_str(name) + _U32.pack(len(dims) if ndim is None else ndim)
            + b"".join(_U64.pack(d) for d in dims) + _U32.pack(ggml_type) + _U64.pack(offset))


BASE_KVS = [_kv_str("general.architecture", "llama"), _kv_u32("llama.block_count", 1),
            _kv_strings("tokenizer.ggml.tokens", ["a", "b", "c"]),
            _kv_str("general.name", "tiny")]
# two float32 tensors: 32 elements (128 bytes) at offset 0, then 8 elements at offset 128
BASE_TENSORS = [_tensor("blk.0.attn_q.weight", (8, 4)), _tensor("blk.0.attn_k.weight", (8,), offset=128)]
DATA_BYTES = 160


def _gguf(kvs: list[bytes] | None = None, tensors: list[bytes] | None = None, version: int = 3,
          n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    kvs = BASE_KVS if kvs is None else kvs
    tensors = BASE_TENSORS if tensors is None else tensors
    head = b"GGUF" + _U32.pack(version) + _U64.pack(len(tensors) if n_tensors is None else n_tensors)
    body = head + _U64.pack(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % 32) + bytes(DATA_BYTES)


def _refused(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    with pytest.raises(GGUFError) as err:
        read_gguf(path)
    assert str(path) in str(err.value)
    assert err.value.__cause__ is None, f"not one of the reader's own checks: {err.value.__cause__!r}"
    return str(err.value)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return tmp_path.resolve() / "corrupt.gguf"


def test_the_builder_writes_valid_gguf(target: Path) -> None:
    target.write_bytes(_gguf())
    gf = read_gguf(target)
    assert gf.metadata["general.name"] == "tiny" and gf.metadata["tokenizer.ggml.tokens"] == 3
    assert gf.tensors["blk.0.attn_q.weight"].shape == (4, 8)
    assert gf.tensors["blk.0.attn_k.weight"].start == gf.tensors["blk.0.attn_q.weight"].start + 128
    reference = gguf.GGUFReader(target)  # and the gguf package reads the same file
    assert [t.name for t in reference.tensors] == list(gf.tensors)


_HUGE_STRING = _U64.pack(2**62) + b"general.architecture"
CASES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "n_tensors 2^60": (_gguf(n_tensors=2**60), ("n_tensors = 1152921504606846976", "cannot fit")),
    "n_tensors 2^63-1": (_gguf(n_tensors=2**63 - 1), ("n_tensors",)),
    "n_kv 2^60": (_gguf(n_kv=2**60), ("n_kv = 1152921504606846976", "cannot fit")),
    "n_kv 2^63-1": (_gguf(n_kv=2**63 - 1), ("n_kv",)),
    "n_tensors past the metadata": (_gguf(n_tensors=12),  # fits after the header, not after the metadata
                                    ("n_tensors = 12", f"after byte {24 + len(b''.join(BASE_KVS))}")),
    "key length 2^62": (_gguf([_HUGE_STRING]), ("string length of metadata key #0's name",
                                                 "4611686018427387904")),
    "value length 2^62": (_gguf([_str("general.name") + _U32.pack(8) + _HUGE_STRING]),
                          ("string length of the value of key 'general.name'",)),
    "numeric array length 2^62": (_gguf([_str("tokenizer.ggml.token_type") + _U32.pack(9) + _U32.pack(5)
                                         + _U64.pack(2**62)]),
                                  ("array length of key 'tokenizer.ggml.token_type'",)),
    "string array length 2^62": (_gguf([_str("tokenizer.ggml.tokens") + _U32.pack(9) + _U32.pack(8)
                                        + _U64.pack(2**62)]),
                                 ("array length of key 'tokenizer.ggml.tokens'",)),
    "skipped item length 2^62": (_gguf([_str("tokenizer.ggml.tokens") + _U32.pack(9) + _U32.pack(8)
                                        + _U64.pack(3) + _str("a") + _HUGE_STRING]),
                                 ("item 1 of key 'tokenizer.ggml.tokens'", "past the end")),
    "kept item length 2^62": (_gguf([_str("general.tags") + _U32.pack(9) + _U32.pack(8) + _U64.pack(2)
                                     + _HUGE_STRING]),
                              ("string length of item 0 of key 'general.tags'",)),
    "unknown value type": (_gguf([_str("general.x") + _U32.pack(13)]), ("'general.x'", "value type 13")),
    "alignment 0": (_gguf(BASE_KVS + [_kv_u32("general.alignment", 0)]),
                    ("general.alignment = 0", "power of two")),
    "alignment 48": (_gguf(BASE_KVS + [_kv_u32("general.alignment", 48)]), ("general.alignment = 48",)),
    "alignment a string": (_gguf(BASE_KVS + [_kv_str("general.alignment", "32")]),
                           ("general.alignment = '32'",)),
    "ndim 5": (_gguf(tensors=[_tensor("t.weight", (1, 1, 1, 1, 1))]),
               ("tensor 't.weight' has ndim = 5", "0 to 4")),
    "ndim 2^31": (_gguf(tensors=[_tensor("t.weight", (8,), ndim=2**31)]), ("ndim = 2147483648",)),
    "duplicate tensor name": (_gguf(tensors=[_tensor("t.weight", (8,)),
                                             _tensor("t.weight", (8,), offset=32)]),
                              ("duplicate tensor name 't.weight'", "#0 and #1")),
    "duplicate key": (_gguf(BASE_KVS + [_kv_u32("llama.block_count", 2)]),
                      ("duplicate metadata key 'llama.block_count'",)),
    "version 4": (_gguf(version=4), ("version = 4", "versions 2 and 3")),
    "version 0": (_gguf(version=0), ("version = 0",)),
    "version 1": (_gguf(version=1), ("version = 1",)),
    "big-endian": (_gguf(version=3 << 24), ("big-endian",)),
    "tensor past the end": (_gguf(tensors=[_tensor("t.weight", (8,), offset=1 << 40)]),
                            ("is truncated: tensor 't.weight'", "Download it again")),
    "tensor too large": (_gguf(tensors=[_tensor("t.weight", (2**40, 2**40))]), ("'t.weight'", "int64")),
    "misaligned offset": (_gguf(tensors=[_tensor("t.weight", (8,), offset=4)]),
                          ("'t.weight' has data offset 4", "general.alignment (32)")),
    "partial block": (_gguf(tensors=[_tensor("t.weight", (33, 1), _Q4_0)]), ("'t.weight'", "block of 32")),
    "no architecture": (_gguf(BASE_KVS[1:]), ("no general.architecture",)),
    "empty file": (b"", ("not a GGUF file",)),
    "bad magic": (b"GGUG" + _gguf()[4:], ("not a GGUF file",)),
    "cut in the header": (_gguf()[:12], ("n_tensors needs 8 bytes at byte 8",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_header_names_the_field(target: Path, case: str) -> None:
    data, expected = CASES[case]
    message = _refused(target, data)
    for part in expected:
        assert part in message, message


def test_errors_stay_value_errors(target: Path) -> None:
    from tandem.loader.gguf_loader import load_gguf_config

    target.write_bytes(_gguf(n_kv=2**60))
    with pytest.raises(ValueError, match="not a valid GGUF file: n_kv"):
        load_gguf_config(target)


# ------------------------------------------------------------------------------------------------
# Fuzzing the bundled SmolLM2 header
# ------------------------------------------------------------------------------------------------


class Mutants:
    """Writes each mutated header to a fresh file, padded (sparsely) to the real file's size so the
    tensors' data is there, and reads it: a GGUFFile, or the GGUFError, checked to name the file."""

    def __init__(self, root: Path, size: int) -> None:
        self.root, self.size, self.count = root, size, 0

    def read(self, data: bytes, pad: bool = True) -> GGUFFile | GGUFError:
        self.count += 1
        path = self.root / f"mutant{self.count}.gguf"
        path.write_bytes(data)
        if pad:
            os.truncate(path, max(self.size, len(data)))
        try:
            return read_gguf(path)
        except GGUFError as err:
            assert str(path) in str(err), str(err)
            assert err.__cause__ is None, f"not one of the reader's own checks: {err.__cause__!r}"
            return err
        finally:
            gguf_reader._read_gguf_cached.cache_clear()
            path.unlink()

    def refused(self, data: bytes, *fields: str, pad: bool = True) -> None:
        result = self.read(data, pad)
        assert isinstance(result, GGUFError), "the mutation parsed"
        assert all(f in str(result) for f in fields), str(result)


class Header:
    """The bundled file's header (plus a little of its data) and where its fields are."""

    def __init__(self, path: Path) -> None:
        gf = read_gguf(path)
        self.size = path.stat().st_size
        self.data_start = min(t.start for t in gf.tensors.values())
        with open(path, "rb") as f:
            self.bytes = f.read(self.data_start + 4096)
        self.names = list(gf.tensors)
        self.directory = self.find_tensor(self.names[0])
        self.tokens = self.bytes.index(_str("tokenizer.ggml.tokens"))

    def find_tensor(self, name: str) -> int:
        return self.bytes.rindex(_str(name))

    def with_bytes(self, pos: int, value: bytes) -> bytes:
        return self.bytes[:pos] + value + self.bytes[pos + len(value):]


@pytest.fixture(scope="module")
def header(bundled_path: Callable[[str], Path]) -> Header:
    return Header(bundled_path("smollm2"))


@pytest.fixture
def mutants(tmp_path: Path, header: Header) -> Mutants:
    return Mutants(tmp_path.resolve(), header.size)


def test_unmutated_header_parses(header: Header, mutants: Mutants) -> None:
    gf = mutants.read(header.bytes)
    assert isinstance(gf, GGUFFile) and list(gf.tensors) == header.names
    assert gf.metadata["tokenizer.ggml.tokens"] == 49152


def test_truncations_are_refused(header: Header, mutants: Mutants) -> None:
    rng = random.Random(1)
    cuts = list(range(0, 64)) + sorted(rng.sample(range(64, header.data_start), 60))
    cuts += [header.directory + d for d in (0, 5, 8, 20, 30, 40, 50)] + [header.data_start + 100]
    for cut in cuts:
        mutants.refused(header.bytes[:cut], pad=False)


def test_targeted_mutations_name_the_field(header: Header, mutants: Mutants) -> None:
    for version in (0, 1, 4):
        mutants.refused(header.with_bytes(4, _U32.pack(version)), "version")
    for count in (2**60, 2**63 - 1, 2**64 - 1):
        mutants.refused(header.with_bytes(8, _U64.pack(count)), "n_tensors")
        mutants.refused(header.with_bytes(16, _U64.pack(count)), "n_kv")
    mutants.refused(header.with_bytes(24, _U64.pack(2**62)), "string length of metadata key #0's name")
    items = header.tokens + len(_str("tokenizer.ggml.tokens")) + 8
    mutants.refused(header.with_bytes(items, _U64.pack(2**62)), "array length of key 'tokenizer.ggml.tokens'")
    mutants.refused(header.with_bytes(items + 8, _U64.pack(2**62)), "item 0 of key 'tokenizer.ggml.tokens'")
    # general.file_type (a uint32) renamed to general.alignment, a key of the same length
    file_type = header.bytes.index(_str("general.file_type"))
    assert header.bytes[file_type + 25:file_type + 29] == _U32.pack(4)
    renamed = header.with_bytes(file_type, _str("general.alignment"))
    for alignment in (0, 48):
        mutated = renamed[:file_type + 29] + _U32.pack(alignment) + renamed[file_type + 33:]
        mutants.refused(mutated, f"general.alignment = {alignment}")
    first = header.names[0]
    for ndim in (5, 2**31):
        mutants.refused(header.with_bytes(header.find_tensor(first) + 8 + len(first), _U32.pack(ndim)),
                        f"tensor {first!r} has ndim = {ndim}")
    twin, later = next((a, b) for i, a in enumerate(header.names) for b in header.names[i + 1:]
                       if len(a) == len(b))
    mutants.refused(header.with_bytes(header.find_tensor(later), _str(twin)),
                    f"duplicate tensor name {twin!r}")
    last = header.names[-1]
    ndim_at = header.find_tensor(last) + 8 + len(last)
    offset = ndim_at + 4 + 8 * _U32.unpack_from(header.bytes, ndim_at)[0] + 4
    mutants.refused(header.with_bytes(offset, _U64.pack(1 << 40)), f"is truncated: tensor {last!r}")


def test_random_mutations(header: Header, mutants: Mutants) -> None:
    """A few hundred mutations, aimed mostly at the structure (the header and scalar keys before the
    vocabulary, and the tensor directory) rather than at vocabulary text: 1-3 flipped bytes, or an
    absurd 8-byte value (a count, length, dimension or offset where one lands) at a random place."""
    rng = random.Random(0)
    regions = [(0, header.tokens + 64), (header.directory, header.data_start), (0, header.data_start)]
    absurd = (2**31, 2**32 - 1, 2**60, 2**62, 2**63 - 1, 2**64 - 1)
    outcomes = {"parsed": 0, "refused": 0}
    for i in range(300):
        lo, hi = rng.choices(regions, weights=(4, 4, 2))[0]
        data = bytearray(header.bytes)
        if i % 3:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(lo, hi)] ^= rng.randrange(1, 256)
        else:
            at = rng.randrange(lo, hi - 8)
            data[at:at + 8] = _U64.pack(rng.choice(absurd))
        result = mutants.read(bytes(data))
        outcomes["parsed" if isinstance(result, GGUFFile) else "refused"] += 1
    assert outcomes["parsed"] > 20 and outcomes["refused"] > 50, outcomes
