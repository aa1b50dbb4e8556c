"""TANDEM_CPU_MATMUL: kernel modes, the bfloat16 weight mode, and refusal of unknown values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem import LLM, SamplingParams
from tandem.layers.embedding import LMHead
from tandem.layers.linear import ColumnParallelLinear, RowParallelLinear, linear
from tandem.layers.matmul_choice import native_bf16

needs_bf16 = pytest.mark.skipif(not native_bf16(), reason="CPU without native bfloat16")


def test_unknown_mode_is_refused_by_name(tiny_dirs, monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "fastest")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_MATMUL='fastest'.*'auto', 'blas', "
                                         r"'onednn', 'c', 'bf16'"):
        LLM(tiny_dirs["llama"])


def test_bf16_mode_is_refused_without_native_bf16(tiny_dirs, monkeypatch):
    import tandem.layers.cpu_matmul_weights as weights
    monkeypatch.setattr(weights, "native_bf16", lambda: False)
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "bf16")
    with pytest.raises(ValueError, match=r"TANDEM_CPU_MATMUL='bf16' needs a CPU with native "
                                         r"bfloat16.*'auto', 'blas' or 'onednn'"):
        LLM(tiny_dirs["llama"])


def test_bf16_weights_multiply_rounded_activations():
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 64), torch.randn(96, 64), torch.randn(96)
    y = linear(x, w.bfloat16(), b)
    assert y.dtype == torch.float32
    # bf16(x) @ bf16(w) accumulated in float32 and rounded to bfloat16 (torch's CPU bf16 matmul
    # returns bf16), then the float32 bias: within one bf16 rounding step of that.
    ref = F.linear(x.bfloat16().float(), w.bfloat16().float()).bfloat16().float() + b
    torch.testing.assert_close(y, ref, rtol=2 ** -7, atol=1e-6)
    assert (y - F.linear(x, w, b)).abs().max() > 1e-2  # the rounding is real


@needs_bf16
def test_bf16_mode_stores_linear_weights_and_stays_lossless(tiny_dirs, prompts, monkeypatch):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    fp32 = LLM(tiny_dirs["llama"]).generate(prompts, greedy, use_tqdm=False)
    monkeypatch.setenv("TANDEM_CPU_MATMUL", "bf16")
    plain = LLM(tiny_dirs["llama"])
    model = plain.llm_engine.model
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear,
                                                            RowParallelLinear))]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    head = next(m for m in model.modules() if isinstance(m, LMHead))
    if head.tied_to is not None:  # the embedding lookup keeps float32 rows
        assert head.tied_to.weight.dtype == torch.float32
        assert head.matmul_weight.dtype == torch.bfloat16
    out = plain.generate(prompts, greedy, use_tqdm=False)
    spec = LLM(tiny_dirs["llama"], speculative_config={
        "model": tiny_dirs["llama_other"], "num_speculative_tokens": 3,
        "adaptive": False}).generate(
        prompts, greedy, use_tqdm=False)
    # Speculation under bf16 weights equals plain decoding under bf16 weights.
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in out]
    # And the rounding is small: most greedy tokens agree with float32 decoding.
    same = sum(a == b for o, r in zip(out, fp32)
               for a, b in zip(o.outputs[0].token_ids, r.outputs[0].token_ids))
    assert same >= 0.5 * sum(len(r.outputs[0].token_ids) for r in fp32)


def test_bf16_rows_do_not_depend_on_the_batch():
    # oneDNN changes kernel (and rounding) with the row count; on an AMX Xeon row 0 of this
    # LM-head-shaped product changed at 64 rows before the fixed 16-row chunks.
    torch.manual_seed(0)
    w = (torch.randn(49152, 576) * 0.05).bfloat16()
    x = torch.randn(100, 576)
    alone = linear(x[:1], w)
    for rows in (2, 5, 16, 17, 64, 100):
        assert torch.equal(linear(x[:rows], w)[:1], alone), rows
