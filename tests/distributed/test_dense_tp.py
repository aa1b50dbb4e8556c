"""Tensor parallelism (tp=2, real gloo processes) for the new dense architectures, where each
adds something of its own: OLMo 2's q/k norms over the whole projection (the mean square summed
over the ranks), and Phi-3's fused checkpoint tensors split before each rank takes its shard
(marked slow: two more processes' start-up)."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.mark.parametrize("arch", ["olmo2", pytest.param("phi3", marks=pytest.mark.slow)])
def test_tp2_equals_tp1(dense_dirs, prompts, arch):
    d = dense_dirs[arch]

    def tokens(llm: LLM) -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(prompts[:3], GREEDY, use_tqdm=False)]

    assert tokens(LLM(d, tensor_parallel_size=2)) == tokens(LLM(d))
