"""The C matmul (tandem/kernels/cpu_gemm.c) for every float32 linear layer: against a float64
reference, rows that never depend on their batch or the thread count, where it is chosen, and
TANDEM_CPU_MATMUL=c."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F

from tandem import LLM, SamplingParams
from tandem.kernels import cpu as cpu_kernels
from tandem.layers import matmul_choice
from tandem.layers.linear import linear


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


# in: one lane block, SmolLM2's hidden and intermediate sizes, partial lane blocks; out: tile
# tails of every kind.
@pytest.mark.parametrize("n,k", [(1, 16), (7, 48), (962, 576), (131, 1536), (9, 40), (5, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_a_float64_reference(fused, n, k, bias):
    torch.manual_seed(0)
    x, w = torch.randn(70, k), torch.randn(n, k) * k ** -0.5
    b = torch.randn(n) if bias else None
    for rows in (1, 2, 3, 5, 16, 17, 70):
        got = cpu_kernels.linear(x[:rows], w, b)
        assert got is not None and got.shape == (rows, n)
        torch.testing.assert_close(got.double(), _reference(x[:rows], w, b), rtol=0, atol=2e-5)


def test_rows_do_not_depend_on_the_batch_or_the_threads(fused):
    torch.manual_seed(1)
    x, w, b = torch.randn(70, 576), torch.randn(963, 576), torch.randn(963)
    full = cpu_kernels.linear(x, w, b)
    for rows in range(1, 70):
        assert torch.equal(cpu_kernels.linear(x[:rows], w, b), full[:rows]), rows
    for start in (1, 5, 13):  # a row's place in the batch does not matter either
        assert torch.equal(cpu_kernels.linear(x[start:start + 9], w, b), full[start:start + 9])
    threads = torch.get_num_threads()
    try:
        for t in {1, 2, threads}:
            torch.set_num_threads(t)
            assert torch.equal(cpu_kernels.linear(x, w, b), full), t
    finally:
        torch.set_num_threads(threads)


def test_layouts_the_kernel_does_not_take_are_refused(fused):
    assert cpu_kernels.linear(torch.randn(3, 64), torch.randn(64, 32).T, None) is None
    assert cpu_kernels.linear(torch.randn(3, 64).double(), torch.randn(8, 64).double(),
                              None) is None
    x, w = torch.randn(3, 64), torch.randn(64, 32).T  # a transposed weight: torch multiplies it
    torch.testing.assert_close(linear(x, w), F.linear(x, w))


def test_the_c_kernel_runs_every_batch_by_default(fused, monkeypatch):
    """Decode, verification and prefill batches all take our kernel (one rounding for a row,
    whatever its batch); the torch kernels run only where asked for by name."""
    monkeypatch.setattr(matmul_choice, "_forced", ["auto"])
    w = torch.randn(96, 40)
    for rows in (1, 16, 64, 65, 256, 1000):
        assert matmul_choice.kernel_for(torch.randn(rows, 40), w, None) is matmul_choice._c
    for mode in matmul_choice.KERNELS:
        monkeypatch.setattr(matmul_choice, "_forced", [mode])
        assert matmul_choice.kernel_for(torch.randn(4, 40), w, None) is \
            matmul_choice.KERNELS[mode]


def test_without_the_kernels_torch_kernels_are_timed_per_bucket(fused, monkeypatch):
    monkeypatch.setattr(matmul_choice, "_forced", ["auto"])
    monkeypatch.setattr(matmul_choice, "_chosen", {})
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    timed = []
    monkeypatch.setattr(matmul_choice, "_time", lambda k, x, w, b: timed.append(x.shape[0]) or 1.0)
    w = torch.randn(32, 16)
    for rows in (1, 3, 4, 200):
        assert matmul_choice.kernel_for(torch.randn(rows, 16), w, None) in \
            matmul_choice.KERNELS.values()
    if len(matmul_choice.KERNELS) > 1:  # one timing per bucket (1, 4, 256), per torch kernel
        assert sorted(set(timed)) == [1, 4, 256]
    assert (32, 16, 256) in matmul_choice._chosen


def test_timings_see_the_weight_come_from_memory(fused, monkeypatch):
    """Each timed call follows an eviction of its weight (a hot weight in L2 favours BLAS's
    kernels, which is not the race a model larger than the caches runs)."""
    events = []
    monkeypatch.setattr(cpu_kernels, "evict", lambda t: events.append(("evict", t)) or True)
    w, x = torch.randn(32, 16), torch.randn(1, 16)
    matmul_choice._time(lambda *a: events.append(("call",)), x, w, None)
    assert events[0] == ("call",)  # the warm-up
    timed = events[1:]
    assert len(timed) >= 6 and all(e[0] == "evict" and e[1] is w for e in timed[::2])
    assert all(e == ("call",) for e in timed[1::2])


def test_evict_leaves_the_data_intact(fused):
    t = torch.randn(1000, 33)
    want = t.clone()
    if platform.machine() in ("x86_64", "aarch64"):
        assert cpu_kernels.evict(t) and cpu_kernels.evict(t[3:])  # any alignment
    assert torch.equal(t, want)


def test_mode_c_forces_the_kernel_and_stays_lossless(tiny_dirs, prompts, native_library,
                                                    monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(tiny_dirs["llama"])
    assert cpu_kernels.enabled()
    w = next(p for n, p in plain.llm_engine.model.named_parameters()
             if n.endswith("qkv_proj.weight"))
    assert matmul_choice.kernel_for(torch.randn(4, w.shape[1]), w, None) is matmul_choice._c
    out = plain.generate(prompts, greedy, use_tqdm=False)
    spec = LLM(tiny_dirs["llama"], speculative_config={
        "model": tiny_dirs["llama_other"], "num_speculative_tokens": 3,
        "adaptive": False}).generate(
        prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in out]


def test_mode_c_is_refused_without_the_kernels(tiny_dirs, monkeypatch):
    monkeypatch.setitem(cpu_kernels._state, "lib", None)
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "torch")
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "c")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_MATMUL='c' needs the fused CPU kernels.*"
                                         r"'auto', 'blas' or 'onednn'"):
        LLM(tiny_dirs["llama"])
