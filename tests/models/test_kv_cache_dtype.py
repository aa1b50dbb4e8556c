"""KV cache formats (`kv_cache_dtype`, attention/kv_format.py and kernels/kv_format.h): the
kernels write and read every format as torch's reference does, to the byte; attention over each
format against a float64 reference on the values the cache holds, at depths 1 to 8,192, on one
and several threads, split over the threads or not (the same bits); the KV budget in bytes;
bad values refused by name; and greedy speculation equal to plain decoding within each format."""

from __future__ import annotations

import platform

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.attention.kv_format import FORMATS, resolve
from tandem.attention.metadata import build_attention_metadata
from tandem.kernels import cpu as cpu_kernels
from models.kernel_builds import library_for_march
from tiny_models import build_tiny_model

FORMAT_NAMES = sorted(FORMATS)


def _rows(d: int) -> torch.Tensor:
    """[N, d] rows with every case a format must round as torch does: ties, the formats' largest
    values and beyond, subnormals, zeros (a q8_0 block of zeros), one huge value in a block."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, d, generator=g) * 3
    x[0] = 0
    x[1, 5] = 1000.0                                    # one huge value: the rest round to 0
    x[2] = 1e-6 * torch.randn(d, generator=g)           # float16's and fp8's subnormals
    x[3, :10] = torch.tensor([447., 448., 449., 464., 500., 1e6, -1e6, 57344., 61440., -0.0])
    x[4] = torch.arange(d) / 2.0 - d / 4                # exact halves: ties to even
    x[5] = torch.arange(d) * 2.0 ** -9                  # e4m3's subnormal steps and their ties
    x[6] = (torch.arange(d) - d / 2) * 2.0 ** -17       # e5m2's
    return x


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("d", [64, 128])
def test_the_kernels_store_and_load_each_format_as_torch_does(fused, name, d):
    fmt = FORMATS[name]
    x = _rows(d)
    stored, loaded = cpu_kernels.kv_rows(x, fmt.code, fmt.row_bytes(d))
    want = fmt.store(x).contiguous().view(torch.uint8).reshape(x.shape[0], -1)
    assert torch.equal(stored, want)
    assert torch.equal(loaded, fmt.load(fmt.store(x)))
    if name != "float32":  # the rounding is real, and within the format's own step
        assert not torch.equal(loaded, x)
    # half a step: relative to the value, and absolute among the subnormals
    rel = {"float32": 0, "bfloat16": 2 ** -8, "float16": 2 ** -11, "fp8_e4m3": 2 ** -4,
           "fp8_e5m2": 2 ** -3}
    sub = {"float32": 0, "bfloat16": 0, "float16": 2 ** -25, "fp8_e4m3": 2 ** -10,
           "fp8_e5m2": 2 ** -17}
    ok = x.abs() < 400  # inside every format's range
    if name == "q8_0":  # half a step of each 32-block's max / 127 (its float16 scale's own
        # rounding aside: a block of values near 1e-6 has a subnormal scale, or none)
        step = x.reshape(x.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 127
        bound = (step * 0.51 * 1.001).expand(-1, -1, 32).reshape(x.shape) + 127 * 2.0 ** -24
        assert ((loaded - x).abs() <= bound).all()
    else:
        assert ((loaded - x).abs()[ok] <= rel[name] * x.abs()[ok] + sub[name]).all()


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
    """One query row per head, float64: q [H, D], k/v [L, Hkv, D] (the stored values)."""
    h, hkv = q.shape[0], k.shape[1]
    out = torch.empty(h, q.shape[1], dtype=torch.float64)
    for hd in range(h):
        g = hd // (h // hkv)
        s = (k[:pos + 1, g].double() @ q[hd].double()) * q.shape[1] ** -0.5
        out[hd] = torch.softmax(s, 0) @ v[:pos + 1, g].double()
    return out


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "q8_0", "fp8_e4m3"])
def test_attention_reads_each_format_at_every_depth(fused, name):
    """Decode rows at depths 1 to 8,192 against float64 on the cache's own values; the same bits
    alone (split over the threads, flash-decoding) and beside 7 other requests (not split), on 1,
    2 and 5 threads."""
    fmt = FORMATS[name]
    h, hkv, d, block = 4, 2, 64, 16
    depths = [1, 100, 1000, 8192]
    g = torch.Generator().manual_seed(1)
    per = max(depths) // block + 2
    k = torch.randn(per * 8 * block + block, hkv, d, generator=g)
    v = torch.randn(k.shape, generator=g)
    kc, vc = fmt.store(k), fmt.store(v)
    kl, vl = fmt.load(kc), fmt.load(vc)
    tables = [list(range(1 + r * per, 1 + (r + 1) * per)) for r in range(8)]
    q = torch.randn(8, h, d, generator=g)
    before = torch.get_num_threads()
    try:
        for depth in depths:
            alone = {}
            for threads in (1, 2, 5):
                torch.set_num_threads(threads)
                meta = build_attention_metadata([1], [depth], tables[:1], block,
                                                torch.device("cpu"))
                out = torch.empty(1, h, d)
                assert cpu_kernels.paged_attention(q[:1], kc, vc, out, meta.requests,
                                                   meta.kv_slots, d ** -0.5, None)
                alone[threads] = out[0]
                meta = build_attention_metadata([1] * 8, [depth] + [200] * 7, tables, block,
                                                torch.device("cpu"))
                outs = torch.empty(8, h, d)
                assert cpu_kernels.paged_attention(q, kc, vc, outs, meta.requests,
                                                   meta.kv_slots, d ** -0.5, None)
                assert torch.equal(outs[0], out[0]), (depth, threads)
            assert torch.equal(alone[1], alone[2]) and torch.equal(alone[1], alone[5])
            slots = meta.kv_slots[0, :depth]
            want = _reference(fmt.query(q[0]), kl[slots], vl[slots], depth - 1)
            torch.testing.assert_close(alone[1].double(), want, rtol=0, atol=2e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["float32", "float16", "q8_0", "fp8_e5m2"])
@pytest.mark.parametrize("h,hkv,d,window,cap", [(4, 1, 64, None, None), (8, 8, 128, 70, None),
                                                (2, 2, 256, None, 30.0)])
def test_a_tile_widened_for_many_rows_keeps_a_decode_rows_bits(fused, name, h, hkv, d, window,
                                                                cap):
    """Where a KV head has many rows (a prefill, a long verification), each tile is widened to
    float32 once for all of them and its scores computed in register blocks: each query's
    output still has the bits it has decoded alone (one row per head: the tile read in place)."""
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(2)
    block, depth, qlen = 16, 300, 24
    table = list(range(1, depth // block + 2))
    k = torch.randn((len(table) + 1) * block, hkv, d, generator=g) * 2
    kc, vc = fmt.store(k), fmt.store(torch.randn(k.shape, generator=g))
    q = torch.randn(qlen, h, d, generator=g)

    def attend(query_lens, seq_lens, rows):
        meta = build_attention_metadata(query_lens, seq_lens, [table] * len(query_lens), block,
                                        torch.device("cpu"))
        out = torch.empty(rows.shape)
        assert cpu_kernels.paged_attention(rows, kc, vc, out, meta.requests, meta.kv_slots,
                                           d ** -0.5, window, cap)
        return out

    many = attend([qlen], [depth], q)  # qlen * h / hkv >= 8 rows per KV head: widened
    for i in range(qlen):
        alone = attend([1], [depth - qlen + 1 + i], q[i:i + 1])
        assert torch.equal(alone[0], many[i]), (name, i)


@pytest.mark.parametrize("name", ["float32", "float16", "q8_0"])
@pytest.mark.parametrize("h,hkv", [(8, 8), (16, 4)])
def test_a_decode_that_streams_its_cache_keeps_the_bits(fused, name, h, hkv):
    """A decode or verification of up to 16 rows a KV head whose layer of keys and values
    outgrows the caches (4 MB: cpu_attention.c's STREAM_BYTES; 6 MB here) runs in phases that
    stream the cache (every head's scores, then every head's values, the next rows asked for
    meanwhile): each query has the same bits decoded alone, in a verification of 8 (a widened
    tile; phased with 8 rows a KV head, not with 32) and at the end of a prefill chunk of 24
    (widened, each tile fetched whole first), on 1 and 2 threads, and matches float64."""
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(4)
    block, d, qlen = 16, 64, 8
    depth = (6 << 20) // (2 * hkv * fmt.row_bytes(d))
    table = list(range(1, depth // block + 2))
    k = torch.randn((len(table) + 1) * block, hkv, d, generator=g)
    kc, vc = fmt.store(k), fmt.store(torch.randn(k.shape, generator=g))
    q = torch.randn(qlen, h, d, generator=g)

    def attend(query_lens, seq_lens, rows):
        meta = build_attention_metadata(query_lens, seq_lens, [table], block,
                                        torch.device("cpu"))
        out = torch.empty(rows.shape)
        assert cpu_kernels.paged_attention(rows, kc, vc, out, meta.requests, meta.kv_slots,
                                           d ** -0.5, None)
        return out, meta

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            many, _ = attend([qlen], [depth], q)  # qlen * h / hkv >= 8 rows a KV head: widened
            chunk, _ = attend([3 * qlen], [depth], torch.cat([torch.randn(2 * qlen, h, d), q]))
            assert torch.equal(chunk[2 * qlen:], many), threads
            for i in range(qlen):
                alone, meta = attend([1], [depth - qlen + 1 + i], q[i:i + 1])
                assert torch.equal(alone[0], many[i]), (threads, i)
    finally:
        torch.set_num_threads(before)
    slots = meta.kv_slots[0, :depth]
    want = _reference(fmt.query(q[-1]), fmt.load(kc)[slots], fmt.load(vc)[slots], depth - 1)
    torch.testing.assert_close(alone[0].double(), want, rtol=0, atol=2e-5)


def test_a_q8_0_cache_scores_the_query_quantized_per_block(fused):
    """Against a q8_0 cache the kernel quantizes each query per 32 numbers (int16, a float32
    scale: attention_q8.h) and sums exact integer products: decoded (2 rows a KV head: the keys
    read in place) and among a prefill's rows (a tile laid out for them) the same bits, which
    match float64 on the quantized query (kv_format.py's `query`), with a block of zeros and
    blocks whose one large number rounds its neighbours to a step or two."""
    _check_q8_0_scores()


def test_the_plain_c_build_scores_a_q8_0_cache_as_well(monkeypatch):
    """The same, built for plain x86-64 (the integer products in plain C, as on CPUs with
    neither AVX2 nor AVX-512)."""
    if platform.machine() != "x86_64":
        pytest.skip("the plain-C build is made here on x86")
    monkeypatch.setitem(cpu_kernels._state, "lib", library_for_march("x86-64"))
    _check_q8_0_scores()


def _check_q8_0_scores() -> None:
    fmt = FORMATS["q8_0"]
    g = torch.Generator().manual_seed(5)
    h, hkv, d, block, depth = 4, 2, 128, 16, 700
    table = list(range(1, depth // block + 2))
    k = torch.randn((len(table) + 1) * block, hkv, d, generator=g)
    kc, vc = fmt.store(k), fmt.store(torch.randn(k.shape, generator=g))
    q = torch.randn(24, h, d, generator=g)
    q[-1, 0, :32] = 0                  # a block of zeros: scale 0
    q[-1, 1, 32:64] = 1e-3 * torch.randn(32, generator=g)
    q[-1, 1, 40] = 50.0                # its neighbours round to a step or two of 50 / 32767
    q[-1, 2, 64:96] = 1e-30            # a tiny block: its scale underflows to a subnormal
    q[-1, 3, 100] = 3e4                # a huge number: the head's weights one key's
    outs = []
    for rows in (q[-1:], q):           # decoded alone; the last of a 24-row prefill (widened)
        meta = build_attention_metadata([rows.shape[0]], [depth], [table], block,
                                        torch.device("cpu"))
        out = torch.empty(rows.shape)
        assert cpu_kernels.paged_attention(rows, kc, vc, out, meta.requests, meta.kv_slots,
                                           d ** -0.5, None)
        outs.append(out[-1])
    assert torch.equal(outs[0], outs[1])
    slots = meta.kv_slots[0, :depth]
    kl, vl = fmt.load(kc)[slots], fmt.load(vc)[slots]
    want = _reference(fmt.query(q[-1]), kl, vl, depth - 1)
    torch.testing.assert_close(outs[0].double(), want, rtol=0, atol=1e-6)
    plain = _reference(q[-1], kl, vl, depth - 1)  # the query unquantized: off in head 1
    assert (outs[0][1].double() - plain[1]).abs().max() > 1e-5


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """A tiny llama with head size 64 (q8_0's blocks of 32 divide it)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("kvfmt") / "llama", "llama", hidden=256))


def test_the_budget_counts_bytes(wide):
    """The same bytes hold twice the blocks in 16 bits, 3.76x in q8_0 (34 bytes per 32 numbers),
    four times in fp8; "auto" on the CPU is float16."""
    blocks = {name: LLM(wide, kv_cache_dtype=name, kv_cache_memory_bytes=1 << 22,
                        max_model_len=256).llm_engine.num_blocks
              for name in ("float32", "float16", "q8_0", "fp8_e5m2", "auto")}
    assert blocks["float16"] == 2 * blocks["float32"] == blocks["auto"]
    assert blocks["q8_0"] == int(blocks["float32"] * 4 * 32 / 34)
    assert blocks["fp8_e5m2"] == 4 * blocks["float32"]
    assert resolve("auto", torch.float32, torch.device("cpu")).name == "float16"
    assert resolve("auto", torch.bfloat16, torch.device("cuda")).name == "bfloat16"


def test_bad_values_are_refused_by_name(tiny_dirs, wide):
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp4' is not supported; choose one of "
                                         r"\['auto', 'float32', 'bfloat16', 'float16', 'fp8'"):
        LLM(wide, kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match=r"speculative_config\['kv_cache_dtype'\]='int4' is not "
                                         r"supported"):
        LLM(wide, speculative_config={"model": wide, "num_speculative_tokens": 2,
                                      "kv_cache_dtype": "int4"})
    with pytest.raises(ValueError, match=r"kv_cache_dtype='q8_0' stores blocks of 32 numbers, "
                                         r"and this model's head size is 16"):
        LLM(tiny_dirs["llama"], kv_cache_dtype="q8_0")


@pytest.mark.parametrize("name", ["bfloat16", "float16", "fp8_e4m3", "q8_0"])
def test_speculation_equals_plain_within_a_format(wide, prompts, name):
    """Greedy tokens and their logprobs, to the bit, on 16 streams at k = 4; the draft with a
    cache of its own (q8_0) beside the target's."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)

    def run(llm: LLM) -> list:
        return [[(t, sorted((i, lp.logprob) for i, lp in lps.items()))
                 for t, lps in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                for o in llm.generate(prompts * 2, params, use_tqdm=False)]

    plain = run(LLM(wide, kv_cache_dtype=name))
    spec = LLM(wide, kv_cache_dtype=name, speculative_config={
        "model": wide, "num_speculative_tokens": 4, "adaptive": False, "kv_cache_dtype": "q8_0"})
    draft_attn = spec.llm_engine.draft_model.attention_layers()[0]
    assert draft_attn.kv_format.name == "q8_0" and draft_attn.k_cache.dtype == torch.uint8
    assert run(spec) == plain
