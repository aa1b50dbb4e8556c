"""The C matmul (tandem/kernels/cpu_gemm.c) for decode and verify batches: against a float64
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


# in: one lane block, SmolLM2's hidden and intermediate sizes; out: tile tails of every kind.
@pytest.mark.parametrize("n,k", [(1, 16), (7, 48), (962, 576), (131, 1536)])
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
    torch.manual_seed(2)
    w = torch.randn(32, 40)  # in not a multiple of 16
    x = torch.randn(3, 40)
    assert cpu_kernels.linear(x, w, None) is None
    assert cpu_kernels.linear(torch.randn(3, 64), torch.randn(64, 32).T, None) is None
    assert cpu_kernels.linear(torch.randn(3, 64).double(), torch.randn(8, 64).double(),
                              None) is None
    # torch runs (oneDNN or BLAS, whichever the start-up timing chose on this host: their sums
    # may differ in the last bits, so not bit-exact against F.linear)
    torch.testing.assert_close(linear(x, w), F.linear(x, w))


def test_the_c_kernel_runs_small_batches_where_it_wins(fused, monkeypatch):
    monkeypatch.setattr(matmul_choice, "_forced", ["auto"])
    monkeypatch.setattr(matmul_choice, "_c_chosen", {})
    monkeypatch.setattr(matmul_choice, "_chosen", {})
    timed = []
    monkeypatch.setattr(matmul_choice, "_c_wins", lambda weights: timed.append(
        tuple(weights[0][0].shape)) or weights[0][0].shape[0] == 96)
    wins, loses = torch.randn(96, 64), torch.randn(80, 64)
    for rows in (1, 16, 64):
        assert matmul_choice.kernel_for(torch.randn(rows, 64), wins, None) is matmul_choice._c
        assert matmul_choice.kernel_for(torch.randn(rows, 64), loses, None) in \
            matmul_choice.KERNELS.values()
    assert timed == [(96, 64), (80, 64)]  # once per weight shape, for all its small batches
    assert matmul_choice.kernel_for(torch.randn(65, 64), wins, None) in \
        matmul_choice.KERNELS.values()  # prefill-sized batches stay with BLAS or oneDNN
    assert matmul_choice.chosen_kernels()["96x64, rows <= 64"] == "c"


def test_the_timing_compares_against_every_torch_kernel(fused, monkeypatch):
    times = {matmul_choice._c: 1.0, **{k: 2.0 for k in matmul_choice.KERNELS.values()}}
    monkeypatch.setattr(matmul_choice, "_time", lambda k, x, w, b: times[k])
    w = torch.randn(16, 32)
    assert matmul_choice._c_wins([(w, None)])
    times[matmul_choice.KERNELS["blas"]] = 0.5
    assert not matmul_choice._c_wins([(w, None)])


def test_a_fused_stacks_shapes_are_chosen_together_by_their_total(fused, monkeypatch):
    """One shape that loses alone by a little must not turn off the C kernel for a stack that
    wins as a whole (the fused stack needs it on every shape), nor a big win on one shape hide
    losses on the others."""
    monkeypatch.setattr(matmul_choice, "_forced", ["auto"])
    monkeypatch.setattr(matmul_choice, "_c_chosen", {})
    a, b, c = torch.randn(32, 16), torch.randn(48, 16), torch.randn(64, 16)
    cost = {32: (1.0, 2.0), 48: (1.1, 1.0), 64: (3.0, 1.0)}  # out -> (C, every torch kernel)
    monkeypatch.setattr(matmul_choice, "_time", lambda k, x, w, bias: cost[w.shape[0]][
        0 if k is matmul_choice._c else 1])
    matmul_choice.choose_c_together([a, b])  # 2.1 < 3.0: both, though b alone loses
    assert matmul_choice._c_chosen == {(32, 16): True, (48, 16): True}
    matmul_choice.choose_c_together([a, c])  # a is decided: c alone, 3.0 > 1.0
    assert matmul_choice._c_chosen[(64, 16)] is False
    monkeypatch.setattr(matmul_choice, "_c_chosen", {})
    matmul_choice.choose_c_together([a, b, c])  # 5.1 > 4.0: none
    assert not any(matmul_choice._c_chosen.values()) and len(matmul_choice._c_chosen) == 3
    monkeypatch.setattr(matmul_choice, "_forced", ["blas"])
    monkeypatch.setattr(matmul_choice, "_c_chosen", {})
    matmul_choice.choose_c_together([a, b])  # a fixed mode times nothing
    assert matmul_choice._c_chosen == {}


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
