"""The SDPA attention path takes whatever memory layout SDPA returns: CUDA's float32 kernel
gives decode outputs that are not contiguous, where the CPU's are, and a `.view` there failed
every request on a GPU (found by benchmarks/cuda_check.py's suite run on an H200)."""

from __future__ import annotations

import torch

from tandem import LLM, SamplingParams
from tandem.attention import sdpa_backend

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_non_contiguous_sdpa_outputs_give_the_same_tokens(tiny_llama, prompts, monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_KERNELS", "torch")  # decode/verify through SDPA, not C
    spec = {"model": tiny_llama, "num_speculative_tokens": 2, "adaptive": False}
    expected = [o.outputs[0].token_ids for o in
                LLM(tiny_llama, speculative_config=spec).generate(prompts[:3], GREEDY,
                                                                  use_tqdm=False)]
    real = sdpa_backend.F.scaled_dot_product_attention
    calls = []

    def strided(*args, **kwargs) -> torch.Tensor:
        out = real(*args, **kwargs)                        # [G, H, L, D]
        calls.append(out.shape)
        return out.transpose(1, 2).contiguous().transpose(1, 2)  # same values, H and L swapped

    monkeypatch.setattr(sdpa_backend.F, "scaled_dot_product_attention", strided)
    got = [o.outputs[0].token_ids for o in
           LLM(tiny_llama, speculative_config=spec).generate(prompts[:3], GREEDY,
                                                             use_tqdm=False)]
    assert calls and got == expected
