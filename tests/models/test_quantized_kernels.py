"""The quantized-weight kernels (kernels/cpu_quant.c, cpu_quantize.c), native and held to AVX2:
dequantization exact against the gguf package, dot products within their stated bound, rows
independent of their batch and the thread count, the same bits from every build (AVX-512 VNNI,
AVX2, plain C), and our blocks readable by gguf's reference."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from models.kernel_builds import library_for_march
from tandem.kernels import quant
from tandem.layers.quantized import PackedQuant, QuantizedWeight, RawQuant

# byte offsets of the float16 scales in each block (the rest of a random block is any bytes)
_F16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


_HALF = ("F16", "BF16")  # float formats, multiplied with x unrounded (cpu_quant_half.c)
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # interleaved


def random_blocks(name: str, rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """uint8 [rows, row bytes] of random blocks of `name` with sane float16 scales."""
    block, nbytes = quant.block_shape(quant.KERNEL_TYPES[name])
    rng = np.random.default_rng(seed)
    if name in _HALF:
        w = torch.from_numpy(rng.uniform(-0.05, 0.05, (rows, k)).astype(np.float32))
        half = w.to(torch.float16 if name == "F16" else torch.bfloat16)
        return half.view(torch.uint8).reshape(rows, 2 * k).clone()
    raw = rng.integers(0, 256, (rows, k // block, nbytes), dtype=np.uint8)
    for at in _F16_AT[name]:
        scales = rng.uniform(-0.05, 0.05, (rows, k // block)).astype(np.float16)
        raw[:, :, at:at + 2] = scales.view(np.uint8).reshape(rows, k // block, 2)
    return torch.from_numpy(raw.reshape(rows, -1).copy())


def _weight(name: str, raw: torch.Tensor, k: int) -> QuantizedWeight:
    return QuantizedWeight([RawQuant(quant.KERNEL_TYPES[name], raw, k, name)])


def _bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|y - x w^T| <= sum_e |w_e| * (ax_e / 2) (+ float rounding): each x_e is rounded to its
    32-block's step ax = max|x| / 127, so it moves by at most half a step. Against K-quant
    weights (prepare_xk in cpu_quant_x.c) the step is D e, under ax + D with D the 256-block's
    max|x| / 1016: the bound takes that (a K weight's k is a multiple of 256)."""
    step = x.reshape(x.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 127  # [m, k/32, 1]
    if x.shape[1] % 256 == 0:
        big = x.reshape(x.shape[0], -1, 256).abs().amax(-1, keepdim=True) / 1016  # [m, k/256, 1]
        step = step + big.repeat_interleave(8, dim=1)
    half_steps = (step / 2).expand(-1, -1, 32).reshape(x.shape)               # [m, k]
    return half_steps @ w.abs().T * 1.001 + 1e-4


@pytest.mark.parametrize("name", sorted(set(quant.KERNEL_TYPES) - set(_HALF)))
def test_dequantized_values_are_exact_and_dot_products_within_the_bound(fused, name):
    k = 512 if name.endswith("_K") else 96
    raw = random_blocks(name, 37, k)
    reference = torch.from_numpy(gguf_dequantize(raw.numpy(), Q[name])).float()
    w = _weight(name, raw, k)
    assert torch.equal(w.dequantize(), reference)
    ids = torch.tensor([5, 0, 36, 5])
    assert torch.equal(w.rows(ids), reference[ids])  # an embedding gather reads rows only
    x = torch.randn(9, k)
    exact = x.double() @ reference.double().T
    err = (w.matmul(x, None).double() - exact).abs()
    assert (err <= _bound(x, reference).double()).all(), float((err / exact.abs()).max())
    assert err.max() > 0  # the activations really are quantized: the bound is the one that binds


@pytest.mark.parametrize("name", sorted(set(quant.KERNEL_TYPES) - set(_HALF)))
def test_the_largest_weights_and_activations_stay_within_the_bound(fused, name):
    """Every weight byte at its largest (u = 15, 31 or 63, K scales and mins 63; Q8_0 q = -128
    or 127) against x rounded to +-127 everywhere. AVX2's vpmaddubsw saturates its 16-bit pair sums:
    Q8_0's sign trick reaches 2 * 128 * 127 = 32512 of 32767 here, and a sum that saturated
    would miss the bound by thousands of steps."""
    k = 512 if name.endswith("_K") else 96
    block = quant.block_shape(quant.KERNEL_TYPES[name])[0]
    raw = random_blocks(name, 37, k).reshape(37, k // block, -1)  # [rows, blocks, block bytes]
    scales = [raw[:, :, at:at + 2].clone() for at in _F16_AT[name]]
    raw[:] = 0xFF
    if name == "Q8_0":
        raw[::2] = 0x80  # q = -128 (even rows) and 127 (odd rows): each sign's largest
        raw[1::2] = 0x7F
    if name == "Q6_K":
        raw[:, :, 192:208] = 0x7F  # int8 sub-block scales
    for at, s in zip(_F16_AT[name], scales):
        raw[:, :, at:at + 2] = s
    raw = raw.reshape(37, -1)
    reference = torch.from_numpy(gguf_dequantize(raw.numpy(), Q[name])).float()
    x = torch.ones(4, k)
    x[1] = -1
    x[2, ::2] = -1
    x[3] = torch.randn(k, generator=torch.Generator().manual_seed(0)).sign()
    for rows in (1, 4):  # a decode step and a verification
        exact = x[:rows].double() @ reference.double().T
        err = (_weight(name, raw, k).matmul(x[:rows], None).double() - exact).abs()
        assert (err <= _bound(x[:rows], reference).double()).all(), float(err.max())


@pytest.mark.parametrize("name", _HALF)
def test_half_precision_rows_are_widened_exactly_and_multiply_unrounded_x(fused, name):
    k = 96
    raw = random_blocks(name, 37, k)
    reference = torch.from_numpy(gguf_dequantize(raw.numpy(), Q[name])).float()
    w = _weight(name, raw, k)
    assert torch.equal(w.dequantize(), reference)
    ids = torch.tensor([5, 0, 36, 5])
    assert torch.equal(w.rows(ids), reference[ids])
    x = torch.randn(9, k)
    exact = x.double() @ reference.double().T
    err = (w.matmul(x, None).double() - exact).abs()
    # float32 sums only: far inside the int8 rounding of x that the block types take
    assert (err <= 1e-6 * (x.abs().double() @ reference.abs().double().T) + 1e-7).all()


@pytest.mark.parametrize("name", sorted(quant.KERNEL_TYPES))
def test_a_row_gets_the_same_bits_at_any_batch_and_thread_count(fused, name):
    # Every row count runs one sequence per output; 608 = 19 blocks of 32 (an odd count), and
    # 70 rows end in a group of 6 interleaved rows.
    k = 768 if name.endswith("_K") else 608
    w = _weight(name, random_blocks(name, 70, k, seed=1), k)
    x = torch.randn(64, k)
    bias = torch.randn(70)
    full = w.matmul(x, bias)
    for rows in (1, 2, 5, 8, 9, 64):
        assert torch.equal(w.matmul(x[:rows], bias), full[:rows])
    assert torch.equal(w.matmul(x[40:47], bias), full[40:47])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = w.matmul(x, bias)
        torch.set_num_threads(2)
        two = w.matmul(x, bias)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, full) and torch.equal(two, full)


def test_x_is_rounded_per_32_half_to_even_within_127(fused):
    """x rows are rounded as llama.cpp rounds activations for Q8_0: per 32 a step max|x| / 127,
    each element to the nearest step, ties to even, at most 127 steps (cpu_quant_x.c, in
    vector registers where the CPU has AVX2, scalar elsewhere). With a step of 1 (every 32 holds
    a +-127) and one-hot Q8_0 rows (d = 1, q = 1 at element r), y [i, r] is x [i, r] rounded."""
    k, n = 64, 64
    raw = np.zeros((n, k // 32, 34), dtype=np.uint8)
    raw[:, :, :2] = np.array([1.0], dtype=np.float16).view(np.uint8)  # d = 1 in every block
    for r in range(n):
        raw[r, r // 32, 2 + r % 32] = 1
    w = _weight("Q8_0", torch.from_numpy(raw.reshape(n, -1).copy()), k)
    g = torch.Generator().manual_seed(3)
    whole = torch.randint(-126, 127, (16, k), generator=g).float()
    frac = torch.tensor([0.0, 0.5, -0.5, 0.25, -0.75, 0.49999997])
    x = whole + frac[torch.randint(0, len(frac), (16, k), generator=g)]
    x[:, ::32] = 127.0 * torch.where(torch.rand(16, k // 32, generator=g) < 0.5, 1.0, -1.0)
    expected = torch.round(x).clamp(-127, 127)  # torch.round: ties to even
    assert (expected != torch.floor(x + 0.5)).any()  # some ties round down, as even
    for rows in (1, 7, 16):
        assert torch.equal(w.matmul(x[:rows], None), expected[:rows])


@pytest.mark.parametrize("k,parts", [
    (128, [("Q5_0", 24), ("Q5_0", 8), ("Q8_0", 8), ("Q4_1", 3)]),
    # K-quants and 32-element types in one matmul: x rounded both ways in one call
    (512, [("Q4_K", 32), ("Q8_0", 16), ("Q6_K", 21), ("Q5_0", 16), ("Q5_K", 16)])])
def test_segments_of_different_types_are_one_weight(fused, k, parts):
    """A Q4_K_M file's fused q/k/v projection: Q5_0, Q5_0 and Q8_0 rows in one matmul (and
    K-quant segments beside 32-element ones)."""
    raws = [RawQuant(quant.KERNEL_TYPES[n], random_blocks(n, r, k, seed=i), k, n)
            for i, (n, r) in enumerate(parts)]
    w = QuantizedWeight(raws)
    x = torch.randn(5, k)
    joint = w.matmul(x, None)
    alone = torch.cat([QuantizedWeight([r]).matmul(x, None) for r in raws], dim=1)
    assert torch.equal(joint, alone)
    assert torch.equal(w.dequantize(), torch.cat([r.dequantize() for r in raws]))


@pytest.mark.parametrize("mode,name,max_err", [("q8_0", "Q8_0", 0.5 / 127),
                                               ("q4_0", "Q4_0", 1 / 8),
                                               ("q4_k", "Q4_K", 1 / 15),
                                               ("q6_k", "Q6_K", 1 / 64)])
def test_quantizing_writes_blocks_the_reference_reads(fused, mode, name, max_err):
    x = torch.randn(16, 512)
    raw = quant.quantize(x, quant.QUANTIZE_TYPES[mode])
    ours = quant.dequantize_rows(quant.KERNEL_TYPES[name], raw, torch.arange(16), 512)
    theirs = torch.from_numpy(gguf_dequantize(raw.numpy(), Q[name])).float()
    assert torch.equal(ours, theirs)  # the layout is ggml's
    # Error per block, relative to the block's largest magnitude: half a step of the format
    # (Q4_K: one step of a sub-block's range, whose 6-bit scale codes round too), plus the
    # float16 rounding of the stored scale (2^-11 relative, times up to 127 steps: 1.15x).
    err = (ours - x).abs().reshape(16, -1, 32)
    scale = x.abs().reshape(16, -1, 32).amax(-1, keepdim=True)
    assert (err <= max_err * scale * 1.15 + 1e-6).all(), float((err / scale).max())


def test_layouts_the_kernel_does_not_take_are_refused(fused):
    w = _weight("Q4_0", random_blocks("Q4_0", 4, 64), 64)
    with pytest.raises(RuntimeError, match="float32 CPU"):
        w.matmul(torch.randn(2, 64, dtype=torch.float64), None)
    bad = torch.tensor([1, 99, 4, w.segments[0].data.data_ptr(), 36], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="refused"):
        quant.qlinear(torch.randn(2, 64), bad, None, 4)  # type 99: no such block
    bad[1] = quant.KERNEL_TYPES["Q4_0"]  # a block type in GGUF's row order: not interleaved
    with pytest.raises(RuntimeError, match="refused"):
        quant.qlinear(torch.randn(2, 64), bad, None, 4)
    with pytest.raises(ValueError, match="blocks of 256"):
        quant.quantize(torch.randn(2, 64), quant.QUANTIZE_TYPES["q4_k"])


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_block_types_are_interleaved_in_every_build(fused, name, monkeypatch):
    """Every build reads 16 interleaved rows (cpu_quant_r16.c: AVX-512 VNNI, AVX2, NEON or plain
    C), so a block type's weight is always kept so: the file's values (read back from either
    layout), rows past a multiple of 16 included. GGUF's own order, once TANDEM_QUANT_LAYOUT=rows,
    is refused with the one value named."""
    k = 512 if name.endswith("_K") else 96
    raw = random_blocks(name, 37, k, seed=3)
    packed = _weight(name, raw, k)
    assert isinstance(packed.segments[0], PackedQuant) and packed.segments[0].data.shape[0] == 3
    reference = torch.from_numpy(gguf_dequantize(raw.numpy(), Q[name])).float()
    assert torch.equal(packed.dequantize(), reference)
    assert torch.equal(RawQuant(quant.KERNEL_TYPES[name], raw, k, name).dequantize(), reference)
    for layout in ("rows", "columns"):
        monkeypatch.setenv("TANDEM_QUANT_LAYOUT", layout)
        with pytest.raises(ValueError, match="the one value is 'interleaved'"):
            _weight(name, raw, k)
    monkeypatch.setenv("TANDEM_QUANT_LAYOUT", "interleaved")
    assert isinstance(_weight(name, raw, k).segments[0], PackedQuant)


def _x_as_prepare_xk_rounds_it(x: torch.Tensor) -> torch.Tensor:
    """x [m, k] rounded as cpu_quant_x.c's prepare_xk does, in its float32 operations (the same
    IEEE results): per 256 D = max / 1016, per 32 e = ceil(max32 / (127 D)) in 1..8, and
    x = D e round(x / (D e)), half to even."""
    xb = x.reshape(x.shape[0], -1, 8, 32)                                 # [m, k/256, 8, 32]
    m32 = xb.abs().amax(-1)                                               # [m, k/256, 8]
    d = m32.amax(-1, keepdim=True) / 1016.0                               # [m, k/256, 1]
    e = torch.where(d > 0, torch.ceil(m32 / (127.0 * d)), 1.0).clamp(1, 8)
    step = (d * e).unsqueeze(-1)                                          # [m, k/256, 8, 1]
    q = torch.round(xb * torch.where(step > 0, 1.0 / step, 0.0)).clamp(-127, 127)
    return (q.double() * step.double()).reshape(x.shape)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_interleaved_k_weights_multiply_x_rounded_per_256_with_sub_steps(fused, name):
    """Against 16 interleaved K-quant rows every scale goes into the integer sums and one float
    step per 256 remains: the result is the exact product of the weight with x rounded as
    prepare_xk rounds it, up to float32 rounding. The 32s' magnitudes differ by up to 1000x, so
    rounding per 256 alone (llama.cpp's Q8_K) or per 32 is off by far more than that."""
    k = 1024
    raw = random_blocks(name, 37, k, seed=5)
    w = _weight(name, raw, k)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, k, generator=g) * 10 ** torch.empty(5, k // 32, 1).uniform_(
        -2, 1, generator=g).expand(-1, -1, 32).reshape(5, k)
    ref = w.dequantize().double()
    expected = _x_as_prepare_xk_rounds_it(x) @ ref.T
    tol = 2e-6 * (x.abs().double() @ ref.abs().T) + 1e-6
    for rows in (1, 5):
        err = (w.matmul(x[:rows], None).double() - expected[:rows]).abs()
        assert (err <= tol[:rows]).all(), float(err.max())
    for size in (256, 32):  # the other roundings would fail the test
        blocks = x.reshape(5, -1, size)
        step = blocks.abs().amax(-1, keepdim=True) / 127
        other = (torch.round(blocks / step) * step).reshape(5, k).double() @ ref.T
        assert ((other - expected).abs() > 10 * tol).any()


@pytest.fixture(scope="module")
def plain_library(native_library):
    """The library as built for x86-64 without AVX2 (its lanes in plain C: quant_r16_c.h)."""
    if platform.machine() != "x86_64":
        pytest.skip("the plain-C build is made here on x86 (Arm's: test_quant_cross_arm.py)")
    return library_for_march("x86-64")


def test_interleaved_rows_get_the_same_bits_from_every_build(native_library, plain_library,
                                                            request, monkeypatch):
    """The 16 lanes are one AVX-512 register, two AVX2 halves or four plain-C quarters, with the
    same operations per lane (quant_r16_vec.h): a weight's outputs are identical bits on every
    kind of CPU, and its values read back the same. The long rows (a group's bytes past
    CHUNK_ABOVE) take the passes' turns every 256 elements."""
    from tandem.kernels import cpu as cpu_kernels
    libs = [native_library, plain_library]
    try:
        libs.append(request.getfixturevalue("avx2_library"))
    except pytest.skip.Exception:
        pass  # the native build is already the AVX2 one
    cases = [(name, k) for name in BLOCK_TYPES
             for k in ((512, 4096) if name.endswith("_K") else (608, 2080))]
    for name, k in cases:
        monkeypatch.setitem(cpu_kernels._state, "lib", native_library)
        raw = random_blocks(name, 37, k, seed=4)
        x = torch.randn(7, k)
        x *= 2.0 ** -torch.randint(0, 6, (1, k // 32)).repeat_interleave(32, 1)  # sub-steps vary
        bias = torch.randn(37)
        outs = []
        for lib in libs:
            monkeypatch.setitem(cpu_kernels._state, "lib", lib)
            w = _weight(name, raw, k)
            assert isinstance(w.segments[0], PackedQuant)
            outs.append((w.matmul(x, bias), w.matmul(x[:1], bias), w.dequantize()))
        for other in outs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(outs[0], other)), (name, k)


def test_packing_a_mapped_file_gives_its_pages_back_and_the_same_bytes(fused, tmp_path,
                                                                        monkeypatch):
    """A GGUF tensor is packed slice by slice and each slice's file pages are given back
    (madvise DONTNEED): the packed bytes equal those of an in-memory copy, and the mapping
    still reads the file's bytes afterwards (pages come back from the file)."""
    raw = random_blocks("Q4_1", 200, 4096, seed=5)  # 2,560 bytes a row: slices span pages
    path = tmp_path / "blocks.bin"
    path.write_bytes(raw.numpy().tobytes())
    mapped = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c", shape=raw.shape))
    expected = quant.pack_r16(quant.KERNEL_TYPES["Q4_1"], raw.clone(), 4096)
    monkeypatch.setattr(quant, "_SLICE_ROWS", 48)
    packed = quant.pack_r16(quant.KERNEL_TYPES["Q4_1"], mapped, 4096, release_source=True)
    assert torch.equal(packed, expected)
    assert torch.equal(mapped, raw)
