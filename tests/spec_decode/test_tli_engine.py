"""A draft with another tokenizer (TLI) through the whole engine: lossless under greedy decoding
with both draft sample methods and both feedback mappings, batched, and everything else still
working beside it (prefix caching, n > 1, seeds, stop strings, logprobs, preemption, aborts).

Target: the tiny byte-level llama; draft: the same layers over a SentencePiece-style vocabulary
(tests/tiny_models.py `build_tli_draft`), so the two share only part of their vocabularies."""

from __future__ import annotations

import shutil

import pytest

from tandem import LLM, SamplingParams
from tandem.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
UNICODE_PROMPT = "naïve café, 日本語 🙂 and\n\ttabs"
# One KV block of both tiny models: 2 layers x 2 KV heads x head_dim 16 x (K, V) x 2 bytes (the
# CPU's default float16 cache) x 16 slots, each.
BLOCK_BYTES = 2 * (2 * 2 * 16 * 2 * 2 * 16)


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def metrics(llm: LLM) -> dict:
    return {m.name: (m.values if hasattr(m, "values") else m.value) for m in llm.get_metrics()
            if hasattr(m, "values") or hasattr(m, "value")}  # histograms have neither


def tli(target: str, draft: str, k: int = 3, method: str = "greedy", feedback: str = "reencode",
        **kwargs) -> LLM:
    return LLM(target, speculative_config={
        "model": draft, "num_speculative_tokens": k, "adaptive": False, "method": "draft_model",
        "use_heterogeneous_vocab": True, "draft_sample_method": method,
        "heterogeneous_vocab_feedback": feedback}, **kwargs)


@pytest.fixture(scope="module")
def plain(tiny_llama) -> LLM:
    return LLM(tiny_llama)


@pytest.fixture(scope="module")
def batch(prompts) -> list[str]:
    return prompts + [UNICODE_PROMPT]


@pytest.fixture(scope="module")
def reference(plain, batch) -> list[list[int]]:
    return tokens(plain.generate(batch, GREEDY, use_tqdm=False))


@pytest.fixture(scope="module")
def spec(tiny_llama, tli_draft) -> LLM:
    return tli(tiny_llama, tli_draft, k=3, method="probabilistic")


@pytest.mark.parametrize("method,feedback,k", [("greedy", "reencode", 3),
                                               ("probabilistic", "reencode", 5),
                                               ("greedy", "unk", 2),
                                               ("probabilistic", "unk", 3)])
def test_greedy_output_equals_plain_decoding(tiny_llama, tli_draft, batch, reference, method,
                                             feedback, k):
    llm = tli(tiny_llama, tli_draft, k=k, method=method, feedback=feedback)
    assert llm.llm_engine.config.speculative_config.uses_vocab_mapping
    assert tokens(llm.generate(batch, GREEDY, use_tqdm=False)) == reference
    m = metrics(llm)
    rate = m["tandem:spec_decode_num_accepted_tokens"] / m["tandem:spec_decode_num_draft_tokens"]
    assert 0.1 < rate < 0.95  # the twin-copied draft agrees often, not always
    assert llm.llm_engine.num_free_kv_blocks() == llm.llm_engine.num_blocks  # nothing leaked


def test_drafts_come_from_the_intersection_and_targets_from_everywhere(spec, batch):
    """Every draft is a target id with a twin; the output still holds tokens without one."""
    engine: LLMEngine = spec.llm_engine
    mapping = engine.proposer.inputs.mapping
    drafted: list[int] = []
    original = engine.runner.execute

    def spy(sched):
        for s in sched.scheduled:
            drafted.extend(s.spec_token_ids)
        return original(sched)

    engine.runner.execute = spy
    try:
        out = spec.generate(batch, SamplingParams(temperature=1.0, seed=3, max_tokens=30,
                                                  ignore_eos=True), use_tqdm=False)
    finally:
        engine.runner.execute = original
    assert drafted and all(int(mapping.target_to_draft[t]) >= 0 for t in drafted)
    emitted = {t for o in out for t in o.outputs[0].token_ids}
    assert any(int(mapping.target_to_draft[t]) < 0 for t in emitted)


def test_flag_with_a_shared_tokenizer_keeps_the_same_vocabulary_path(tiny_llama):
    llm = tli(tiny_llama, tiny_llama, k=3)
    assert not llm.llm_engine.config.speculative_config.uses_vocab_mapping
    llm.generate("Hello", GREEDY, use_tqdm=False)
    m = metrics(llm)
    assert m["tandem:spec_decode_num_accepted_tokens"] == m["tandem:spec_decode_num_draft_tokens"]


def test_draft_without_a_tokenizer_is_a_clear_error(tiny_llama, tli_draft, tmp_path):
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(tli_draft, broken)
    for f in broken.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            f.unlink()
    with pytest.raises(ValueError) as e:
        tli(tiny_llama, str(broken))
    assert "speculative_config['model']" in str(e.value) and "tokenizer" in str(e.value)


def test_seeded_sampling_is_reproducible_whatever_the_batch(spec, batch):
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=24, n=2)
    alone = [c.token_ids for c in spec.generate(batch[0], sp, use_tqdm=False)[0].outputs]
    mixed = spec.generate(batch, [sp] + [SamplingParams(temperature=0.7, max_tokens=24)] * 8,
                          use_tqdm=False)[0]
    assert [c.token_ids for c in mixed.outputs] == alone
    assert alone[0] != alone[1]  # the two choices are distinct samples


def test_prefix_cache_hits_keep_output_exact(tiny_llama, tli_draft, plain):
    llm = tli(tiny_llama, tli_draft, k=3)
    base = ("Speculative decoding uses a small draft model to propose tokens that a large "
            "target model verifies in one pass, which makes generation faster. ")
    prompts = [base + "Hello, my name is", base + "The capital of France is"]
    first = llm.generate(prompts[0], GREEDY, use_tqdm=False)[0]
    second = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0]
    assert second.num_cached_tokens >= 16
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == tokens(
        plain.generate(prompts, GREEDY, use_tqdm=False))


def test_stop_strings_and_logprobs_match_plain(spec, plain, batch):
    text = plain.generate(batch[1], GREEDY, use_tqdm=False)[0].outputs[0].text
    stop = text[8:11]
    sp = SamplingParams(temperature=0, max_tokens=40, stop=[stop], logprobs=2, ignore_eos=True)
    a = spec.generate(batch[1], sp, use_tqdm=False)[0].outputs[0]
    b = plain.generate(batch[1], sp, use_tqdm=False)[0].outputs[0]
    assert (a.text, a.token_ids, a.finish_reason, a.stop_reason) == \
        (b.text, b.token_ids, "stop", stop)
    for x, y in zip(a.logprobs, b.logprobs):
        assert set(x) == set(y)
        for t in x:
            assert x[t].logprob == pytest.approx(y[t].logprob, abs=1e-4)
    assert a.spec_decode_stats.num_draft_tokens > 0


def test_forced_preemption_stays_exact_and_frees_everything(tiny_llama, tli_draft, batch):
    """A KV budget far below the batch's needs: the target reclaims draft blocks and preempts."""
    llm = tli(tiny_llama, tli_draft, k=3, method="probabilistic",
              kv_cache_memory_bytes=20 * BLOCK_BYTES, max_model_len=128)
    engine = llm.llm_engine
    assert engine.num_blocks == 20
    reclaims = []
    reclaim = engine.scheduler._reclaim_draft_blocks
    engine.scheduler._reclaim_draft_blocks = lambda: reclaims.append(1) or reclaim()
    reference = tokens(LLM(tiny_llama, max_model_len=128).generate(batch, GREEDY, use_tqdm=False))
    assert tokens(llm.generate(batch, GREEDY, use_tqdm=False)) == reference
    assert engine.scheduler.num_preemptions > 0 and reclaims
    assert engine.num_free_kv_blocks() == engine.num_blocks
    assert not engine.kv.draft_blocks and not engine.kv.req_blocks


def test_abort_frees_target_and_draft_blocks(spec, batch):
    engine: LLMEngine = spec.llm_engine
    for i, p in enumerate(batch):
        engine.add_request(f"abort-{i}", p, SamplingParams(temperature=0, max_tokens=50))
    for _ in range(4):
        engine.step()
    assert engine.kv.draft_blocks  # the draft holds blocks of its own
    for i in range(len(batch)):
        engine.abort_request(f"abort-{i}")
    assert not engine.has_unfinished_requests()
    assert engine.num_free_kv_blocks() == engine.num_blocks and not engine.kv.draft_blocks


def test_drafting_stops_at_the_drafts_max_model_len(tiny_llama, tli_draft, plain, batch):
    """speculative max_model_len bounds the draft's own positions; past it the target decodes
    alone, with the same output."""
    llm = LLM(tiny_llama, speculative_config={
        "model": tli_draft, "num_speculative_tokens": 3, "adaptive": False,
        "use_heterogeneous_vocab": True,
        "max_model_len": 24})
    out = llm.generate(batch[0], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference_for(plain, batch[0])
    stats = out.outputs[0].spec_decode_stats
    assert 0 < stats.num_spec_steps < 10  # drafting stopped once the draft's context filled


def reference_for(plain: LLM, prompt: str) -> list[int]:
    return plain.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
