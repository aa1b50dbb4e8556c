"""The fused CPU kernels (tandem/kernels): each against a direct torch reference, rows that do not
depend on their batch, whole models against transformers on both paths, and TANDEM_CPU_KERNELS."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.attention.context import forward_context
from tandem.attention.metadata import build_attention_metadata
from tandem.kernels import cpu as cpu_kernels
from tandem.kernels import cpu_sampling
from tandem.kernels import cpu_build
from tandem.layers import matmul_choice
from tandem.layers.norm import RMSNorm
from tandem.layers.rotary import RotaryEmbedding, rotate_qk
from tandem.loader.weights import iter_safetensors
from tandem.models.registry import build_model


@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("dim", [576, 40, 7])  # lanes, a partial last lane block, fewer than 16
def test_add_rms_norm_matches_torch(fused, unit_offset, dim):
    torch.manual_seed(0)
    x, delta, w = torch.randn(5, dim), torch.randn(5, dim), torch.randn(dim)
    scale = 1.0 + w if unit_offset else w
    normed = cpu_kernels.rms_norm(x, w, 1e-6, unit_offset)
    torch.testing.assert_close(normed, F.rms_norm(x, (dim,), scale, 1e-6), rtol=1e-5, atol=1e-6)
    residual = x.clone()
    normed, out = cpu_kernels.add_rms_norm(delta, residual, w, 1e-6, unit_offset)
    assert out is residual  # the stream is updated in place
    torch.testing.assert_close(out, x + delta, rtol=0, atol=0)
    torch.testing.assert_close(normed, F.rms_norm(x + delta, (dim,), scale, 1e-6),
                               rtol=1e-5, atol=1e-6)
    normed, start = cpu_kernels.add_rms_norm(x, None, w, 1e-6, unit_offset)
    assert start is not x and torch.equal(start, x)  # a new stream, never the input


def test_silu_and_mul_matches_torch(fused):
    torch.manual_seed(0)
    x = torch.randn(6, 2 * 1000) * 8  # large |x| too: exp's clamp must not show
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels.silu_and_mul(x), F.silu(gate) * up,
                               rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("norms", [None, False, True])  # none (Llama), Qwen3's, Gemma's 1 + w
def test_rope_and_kv_write_match_torch(fused, norms):
    torch.manual_seed(0)
    t, h, hkv, d = 5, 6, 2, 32
    qkv = torch.randn(t, (h + 2 * hkv) * d)
    rope = RotaryEmbedding(d, {"rope_theta": 10000.0, "rope_type": "default"})(
        torch.tensor([3, 0, 17, 4, 100]))
    q_norm = k_norm = None
    if norms is not None:
        q_norm, k_norm = RMSNorm(d, 1e-6, unit_offset=norms), RMSNorm(d, 1e-6, unit_offset=norms)
        q_norm.weight.data.normal_()
        k_norm.weight.data.normal_()
    slots = torch.tensor([9, 2, 30, 31, 0])
    k_cache, v_cache = torch.zeros(32, hkv, d), torch.zeros(32, hkv, d)
    heads = qkv.view(t, h + 2 * hkv, d)
    with torch.no_grad():
        want_q, want_k = rotate_qk(heads.clone(), rope, h, q_norm, k_norm)
    want_v = heads[:, h + hkv:].clone()
    assert cpu_kernels.rope_write_kv(qkv, rope, slots, k_cache, v_cache, h, hkv, d, q_norm,
                                     k_norm)
    torch.testing.assert_close(heads[:, :h], want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache[slots], want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(v_cache[slots], want_v)


def _reference_attention(q, k_cache, v_cache, query_lens, seq_lens, tables, block, window):
    """Attention written out per query in float64, from the block tables."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    h, hkv = q.shape[1], k_cache.shape[1]
    row = 0
    for qlen, slen, table in zip(query_lens, seq_lens, tables):
        slots = torch.tensor([table[p // block] * block + p % block for p in range(slen)])
        keys, values = k_cache[slots].double(), v_cache[slots].double()  # [L, Hkv, D]
        for i in range(qlen):
            pos = slen - qlen + i
            lo = max(0, pos - window + 1) if window else 0
            for hd in range(h):
                g = hd // (h // hkv)
                s = keys[lo:pos + 1, g] @ q[row, hd].double() * q.shape[2] ** -0.5
                out[row, hd] = torch.softmax(s, 0) @ values[lo:pos + 1, g]
            row += 1
    return out


@pytest.mark.parametrize("h,hkv,d,window", [(9, 3, 64, None), (4, 4, 32, None),
                                            (8, 2, 128, 5), (6, 1, 16, 3)])
def test_paged_attention_matches_a_direct_reference(fused, h, hkv, d, window):
    torch.manual_seed(0)
    block = 4
    query_lens, seq_lens = [1, 3, 1, 2], [7, 12, 40, 2]  # decode, verify, a long one, a new one
    tables = [[5, 2], [1, 9, 3], [10 + i for i in range(10)], [4]]
    k_cache, v_cache = torch.randn(24 * block, hkv, d), torch.randn(24 * block, hkv, d)
    k_cache[:block] = v_cache[:block] = 0  # the null block
    qkv = torch.randn(sum(query_lens), h + 2 * hkv, d)
    q = qkv[:, :h]  # a view with the projection's token stride, as the model passes it
    meta = build_attention_metadata(query_lens, seq_lens, tables, block, torch.device("cpu"))
    group = meta
    out = torch.empty(q.shape)
    assert cpu_kernels.paged_attention(q, k_cache, v_cache, out, group.requests, group.kv_slots,
                                       d ** -0.5, window)
    want = _reference_attention(q, k_cache, v_cache, query_lens, seq_lens, tables, block, window)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_attention_rows_do_not_depend_on_the_batch(fused):
    """A query's output has the same bits alone, beside other requests, and as one of several
    verified positions: speculative and plain decoding see identical attention."""
    torch.manual_seed(1)
    h, hkv, d, block = 9, 3, 64, 16
    k_cache, v_cache = torch.randn(40 * block, hkv, d), torch.randn(40 * block, hkv, d)
    table = [7, 3, 21, 30]
    q = torch.randn(4, h, d)

    def attend(query_lens, seq_lens, tables, rows):
        meta = build_attention_metadata(query_lens, seq_lens, tables, block, torch.device("cpu"))
        qs = torch.cat([rows] + [torch.randn(n, h, d) for n in query_lens[1:]])
        out = torch.empty(qs.shape)
        g = meta
        assert cpu_kernels.paged_attention(qs, k_cache, v_cache, out, g.requests, g.kv_slots,
                                           0.125, None)
        return out[:rows.shape[0]]

    verify = attend([4], [50], [table], q)  # positions 46..49 in one verification
    for i in range(4):
        alone = attend([1], [47 + i], [table], q[i:i + 1])
        batched = attend([1, 3, 1], [47 + i, 20, 63], [table, [1, 2], [5, 6, 8, 9]], q[i:i + 1])
        assert torch.equal(alone[0], verify[i]) and torch.equal(batched[0], verify[i]), i


def test_attention_threads_split_requests_without_changing_bits(fused):
    torch.manual_seed(3)
    h, hkv, d, block, reqs = 8, 2, 64, 16, 12
    k_cache = torch.randn(reqs * 20 * block, hkv, d)
    v_cache = torch.randn_like(k_cache)
    tables = [[r * 20 + i for i in range(20)] for r in range(reqs)]
    meta = build_attention_metadata([2] * reqs, [300 + r for r in range(reqs)], tables, block,
                                    torch.device("cpu"))  # big enough for the threads to wake
    g = meta
    q = torch.randn(2 * reqs, h, d)
    outs = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(torch.empty(q.shape))
            assert cpu_kernels.paged_attention(q, k_cache, v_cache, outs[-1], g.requests,
                                               g.kv_slots, 0.125, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_attention_of_requests_without_queries_reads_nothing_on_any_threads(fused):
    """A step whose requests have no queries has no work items; on more than one thread the
    cut by KV heads once divided by their number (SIGFPE)."""
    k_cache = torch.randn(64, 2, 64)
    meta = build_attention_metadata([0, 0], [10, 20], [[1, 2], [3]], 16, torch.device("cpu"))
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 5):
            torch.set_num_threads(t)
            assert cpu_kernels.paged_attention(torch.empty(0, 4, 64), k_cache, k_cache,
                                               torch.empty(0, 4, 64), meta.requests,
                                               meta.kv_slots, 0.125, None)
    finally:
        torch.set_num_threads(threads)

def test_norm_rows_do_not_depend_on_the_batch(fused):
    torch.manual_seed(0)
    x, w = torch.randn(33, 576), torch.randn(576)
    alone = cpu_kernels.rms_norm(x[:1], w, 1e-5, False)
    for rows in (2, 16, 33):
        assert torch.equal(cpu_kernels.rms_norm(x[:rows], w, 1e-5, False)[:1], alone)


@pytest.mark.parametrize("vocab", [49152, 40, 7])  # long rows, a partial last lane block, short
def test_argmax_picks_what_torch_picks(fused, vocab):
    """Greedy rows' token (cpu_gumbel.c's tandem_argmax): the first of equal maxima, a row's
    first NaN, column 0 of an all -inf row, at any row count and thread count."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, vocab, generator=g)
    x[1, [3, vocab - 2]] = 9.0                           # a tie: the first column wins
    x[2, [vocab - 1, 2]] = float("inf")                  # the same with infinities
    x[3] = float("-inf")
    x[4, [vocab - 1, vocab // 2]] = float("nan")         # the first NaN, wherever the maximum
    x[4, 0] = 50.0
    x[5] = 1.0                                           # all equal
    x[6, vocab - 1] = 20.0                               # the maximum in the last column
    x[7] = x[7].round()                                  # many ties
    expected = x.argmax(dim=-1)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for rows in (1, 5, 16):
                assert torch.equal(cpu_sampling.argmax(x[:rows].contiguous()), expected[:rows])
    finally:
        torch.set_num_threads(threads)
    assert cpu_sampling.argmax(x[:, ::2]) is None        # a layout it does not read: torch's


def _logits(model_dir: str, prompt_ids: list[int]) -> torch.Tensor:
    """Our model's logits for a prompt prefilled in two chunks and then one decode step."""
    model = build_model(AutoConfig.from_pretrained(model_dir), torch.float32,
                        torch.device("cpu"), iter_safetensors(model_dir))
    for attn in model.attention_layers():
        attn.k_cache = torch.zeros(64 * 4, attn.num_kv_heads, attn.head_dim)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    table = [list(range(1, 33))]
    n = len(prompt_ids)
    parts = []
    for start, stop in ((0, n // 2), (n // 2, n - 1), (n - 1, n)):  # chunk, chunk, decode
        ids = torch.tensor(prompt_ids[start:stop])
        meta = build_attention_metadata([stop - start], [stop], table, 4, torch.device("cpu"))
        with forward_context(meta), torch.no_grad():
            parts.append(model.compute_logits(model(ids, torch.arange(start, stop))))
    return torch.cat(parts)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_models_match_transformers_on_both_paths(tiny_dirs, prompts, library, monkeypatch, arch):
    d = tiny_dirs[arch]
    ids = AutoTokenizer.from_pretrained(d).encode(prompts[2])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()(
            torch.tensor([ids])).logits[0]
    monkeypatch.setitem(cpu_kernels._state, "lib", library)
    monkeypatch.setattr(matmul_choice, "_forced", ["c"])  # the C matmul too, for its batches
    fused = _logits(d, ids)
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    monkeypatch.setattr(matmul_choice, "_forced", ["blas"])
    plain = _logits(d, ids)
    torch.testing.assert_close(fused, want, atol=1e-3, rtol=0)
    torch.testing.assert_close(plain, want, atol=1e-3, rtol=0)
    assert not torch.equal(fused, plain)  # the two paths really are different code


def test_unknown_mode_is_refused_by_name(tiny_dirs, monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_KERNELS='fast'.*'auto', 'c', 'torch'"):
        LLM(tiny_dirs["llama"])


def test_without_a_compiler_auto_falls_back_and_c_refuses(tiny_dirs, prompts, monkeypatch,
                                                          caplog):
    monkeypatch.setattr(cpu_build, "_compiler", lambda: None)
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    with caplog.at_level("WARNING", logger="tandem"):
        out = LLM(tiny_dirs["llama"]).generate(prompts[:1], greedy, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4 and not cpu_kernels.enabled()
    assert "no C compiler found" in caplog.text
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "c")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_KERNELS='c' needs the fused CPU kernels.*"
                                         r"no C compiler found.*'auto' or 'torch'"):
        LLM(tiny_dirs["llama"])


def test_cpu_march_is_validated_and_refused_by_name(tiny_dirs, monkeypatch, caplog):
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    monkeypatch.setenv("TANDEM_CPU_MARCH", "-O0 -g")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_MARCH='-O0 -g' is not a compiler target"):
        LLM(tiny_dirs["llama"])
    monkeypatch.setenv("TANDEM_CPU_MARCH", "haswell")
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "torch")
    with caplog.at_level("WARNING", logger="tandem"):
        cpu_kernels.configure(torch.device("cpu"))  # not silently ignored: said so
    assert "TANDEM_CPU_MARCH=haswell has no effect" in caplog.text and not cpu_kernels.enabled()
    monkeypatch.delenv("TANDEM_CPU_KERNELS")
    if cpu_build._compiler() is None or platform.machine() != "x86_64":
        pytest.skip("needs an x86 C compiler")
    monkeypatch.setenv("TANDEM_CPU_MARCH", "pentium-9000")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_MARCH='pentium-9000': .*does not know "
                                         r"-march=pentium-9000"):
        LLM(tiny_dirs["llama"])
    # A target with instructions this CPU lacks would die of SIGILL at the first call.
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma", "f16c"})
    monkeypatch.setenv("TANDEM_CPU_MARCH", "skylake-avx512")
    with pytest.raises(ValueError, match=r"-march=skylake-avx512 uses instructions this CPU "
                                         r"lacks: avx512bw, avx512dq, avx512f, avx512vl"):
        LLM(tiny_dirs["llama"])


def test_the_cache_is_keyed_by_cpu_and_source(monkeypatch, tmp_path):
    # The compiler's runs are recorded, not made (a real build is ~50 s on two cores, and the
    # native_library fixture builds one): what is tested is when a build happens.
    if cpu_build._compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    runs: list[list[str]] = []

    def compile_(cc: str, args: list[str], what: str) -> None:
        runs.append(args)
        Path(args[args.index("-o") + 1]).write_bytes(b"")

    monkeypatch.setattr(cpu_build, "_compile", compile_)
    first = cpu_build.build_library()
    built = len(runs)
    assert built == len(cpu_build.SOURCES) + 1  # each source, then the link
    assert first.parent == tmp_path / "kernels" and first.exists()
    assert cpu_build.build_library() == first and len(runs) == built  # the cached copy
    monkeypatch.setattr(cpu_build, "_cpu_identity", lambda: "model name: another CPU\n")
    other = cpu_build.build_library()  # another CPU kind compiles its own copy
    assert other != first and other.exists() and len(runs) == 2 * built


def test_head_sizes_the_kernel_refuses_fall_back_to_sdpa(native_library, monkeypatch):
    from tandem.attention.sdpa_backend import paged_attention as backend_attention
    torch.manual_seed(0)
    h, hkv, d, block = 4, 2, 8, 4  # head_dim 8: not a multiple of 16
    k_cache, v_cache = torch.randn(16 * block, hkv, d), torch.randn(16 * block, hkv, d)
    k_cache[:block] = v_cache[:block] = 0
    q = torch.randn(3, h, d)
    meta = build_attention_metadata([1, 2], [5, 9], [[2, 3], [4, 5, 6]], block,
                                    torch.device("cpu"))
    monkeypatch.setitem(cpu_kernels._state, "lib", native_library)
    assert not cpu_kernels.attention_takes(d)
    out = torch.empty(q.shape)
    g = meta
    assert not cpu_kernels.paged_attention(q, k_cache, v_cache, out, g.requests, g.kv_slots,
                                           d ** -0.5, None)  # refused, nothing written
    got = backend_attention(q, k_cache, v_cache, meta, d ** -0.5, None)
    want = _reference_attention(q, k_cache, v_cache, [1, 2], [5, 9], [[2, 3], [4, 5, 6]], block,
                                None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
