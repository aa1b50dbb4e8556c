"""CUDA graphs on a CUDA machine with triton (skipped elsewhere; run by benchmarks/gpu.sh):
graphed steps give eager steps' greedy tokens, plain and speculative; speculative greedy equals
plain under graphs; a replayed step makes no host sync; capture logs its time and memory.
The CPU suite covers the same runner through stand-ins (tests/kernels_triton/
test_triton_engine.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPTS = ["The future of AI is", "Hello, my name is", "Once upon a time there was a robot",
           "1 2 3 4 5", "The capital of France is"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def generate(model: str, dtype: str, **kwargs: Any) -> tuple[list[list[int]], Any]:
    llm = LLM(model, dtype=dtype, max_num_seqs=8, device="cuda", disable_log_stats=True,
              kv_cache_memory_bytes=1 << 26, **kwargs)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    runner = llm.llm_engine.executor.runners["target"]
    return [list(o.outputs[0].token_ids) for o in outs], runner


@pytest.fixture(scope="module", autouse=True)
def triton_installed():
    pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_equals_eager(tiny_llama, dtype, caplog):
    eager, eager_runner = generate(tiny_llama, dtype, enforce_eager=True)
    assert not eager_runner.graphs and eager_runner.buffers is not None  # the Triton route
    with caplog.at_level(logging.INFO, logger="tandem"):
        graphed, runner = generate(tiny_llama, dtype)
    assert sorted(runner.graphs) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert runner.replays[(8, 1)] > 0  # 5 requests padded to 8
    assert "CUDA graphs: 4 graphs" in caplog.text and "MiB" in caplog.text
    assert graphed == eager


def test_speculative_greedy_equals_plain_under_graphs(tiny_llama):
    plain, _ = generate(tiny_llama, "float32")
    spec = {"model": tiny_llama, "num_speculative_tokens": 3, "adaptive": False}
    speculative, runner = generate(tiny_llama, "float32", speculative_config=spec)
    assert runner.replays[(8, 4)] > 0  # verification of 1 + 3 tokens, graphed
    assert speculative == plain


def test_a_replayed_step_makes_no_host_sync(tiny_llama):
    """The graph path of the runner (fill, one copy, replay, logits rows) under torch's sync
    debug mode, which raises on any synchronizing call."""
    llm = LLM(tiny_llama, dtype="float32", max_num_seqs=8, device="cuda",
              disable_log_stats=True, kv_cache_memory_bytes=1 << 26)
    runner = llm.llm_engine.executor.runners["target"]
    run, checked = runner.run, []

    def no_sync(batch, rows):
        graphed = runner._bucket(batch) is not None
        if graphed:
            torch.cuda.set_sync_debug_mode("error")
        try:
            return run(batch, rows)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            checked.append(graphed)

    llm.llm_engine.runner.forward = no_sync
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                 use_tqdm=False)
    assert any(checked)
