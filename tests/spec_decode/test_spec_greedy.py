"""Speculative decoding is lossless under greedy decoding and exact about every stop condition."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def metrics(llm: LLM) -> dict:
    return {m.name: (m.values if hasattr(m, "values") else m.value) for m in llm.get_metrics()
            if hasattr(m, "values") or hasattr(m, "value")}  # histograms have neither


@pytest.fixture(scope="module")
def plain(tiny_dirs) -> LLM:
    return LLM(tiny_dirs["llama"])


@pytest.fixture(scope="module")
def reference(plain, prompts) -> list[list[int]]:
    return tokens(plain.generate(prompts, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("draft,k,method", [("llama", 3, "greedy"), ("llama", 5, "probabilistic"),
                                            ("llama_other", 3, "greedy"),
                                            ("llama_other", 1, "probabilistic")])
def test_greedy_output_equals_plain_decoding(tiny_dirs, prompts, reference, draft, k, method):
    llm = LLM(tiny_dirs["llama"], speculative_config={
        "model": tiny_dirs[draft], "num_speculative_tokens": k, "adaptive": False,
        "draft_sample_method": method})
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    m = metrics(llm)
    assert m["tandem:spec_decode_num_draft_tokens"] > 0  # it really speculated
    rate = m["tandem:spec_decode_num_accepted_tokens"] / m["tandem:spec_decode_num_draft_tokens"]
    if draft == "llama":
        assert rate >= 0.99
    else:
        assert rate < 0.5  # an unrelated random draft is mostly rejected


def test_self_draft_acceptance_length_is_k_plus_one(tiny_dirs, prompts):
    k = 4
    llm = LLM(tiny_dirs["llama"], speculative_config={"model": tiny_dirs["llama"],
                                                      "num_speculative_tokens": k,
                                                      "adaptive": False})
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=81, ignore_eos=True),
                        use_tqdm=False)
    m = metrics(llm)
    drafts = m["tandem:spec_decode_num_drafts"]
    assert m["tandem:spec_decode_num_accepted_tokens"] / m["tandem:spec_decode_num_draft_tokens"] >= 0.99
    assert 1 + m["tandem:spec_decode_num_accepted_tokens"] / drafts == pytest.approx(k + 1, abs=0.05)
    assert m["tandem:spec_decode_num_accepted_tokens_per_pos"] == [drafts] * k
    per_request = outs[0].spec_decode_stats
    assert per_request.mean_acceptance_length == pytest.approx(k + 1, abs=0.05)
    assert per_request.acceptance_histogram[-1] == per_request.num_spec_steps


@pytest.fixture(scope="module")
def spec(tiny_dirs) -> LLM:
    return LLM(tiny_dirs["llama"], speculative_config={"model": tiny_dirs["llama_other"],
                                                       "num_speculative_tokens": 3,
                                                       "adaptive": False,
                                                       "draft_sample_method": "probabilistic"})


@pytest.fixture(scope="module")
def self_spec(tiny_dirs) -> LLM:
    """Every draft accepted: several tokens land per step, the case where overshoot could occur."""
    return LLM(tiny_dirs["llama"], speculative_config={"model": tiny_dirs["llama"],
                                                       "num_speculative_tokens": 5,
                                                       "adaptive": False})


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 7, 11])
def test_max_tokens_is_never_overshot(plain, self_spec, prompts, max_tokens):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    got = tokens(self_spec.generate(prompts[:3], sp, use_tqdm=False))
    assert got == tokens(plain.generate(prompts[:3], sp, use_tqdm=False))
    assert all(len(t) == max_tokens for t in got)


def test_stop_strings_and_tokens_cut_exactly(plain, self_spec, prompts):
    full = plain.generate(prompts[1], GREEDY, use_tqdm=False)[0].outputs[0]
    stop = full.text[12:15]
    sp = SamplingParams(temperature=0, max_tokens=40, stop=[stop], ignore_eos=True)
    a = plain.generate(prompts[1], sp, use_tqdm=False)[0].outputs[0]
    b = self_spec.generate(prompts[1], sp, use_tqdm=False)[0].outputs[0]
    assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == \
        (a.text, a.token_ids, "stop", stop)
    target = full.token_ids[6]
    sp = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[target], ignore_eos=True)
    b = self_spec.generate(prompts[1], sp, use_tqdm=False)[0].outputs[0]
    assert b.token_ids == full.token_ids[:full.token_ids.index(target) + 1]
    assert b.stop_reason == target


def test_logprobs_are_the_targets(plain, spec, prompts):
    sp = SamplingParams(temperature=0, max_tokens=12, logprobs=2, ignore_eos=True)
    a = plain.generate(prompts[:2], sp, use_tqdm=False)
    b = spec.generate(prompts[:2], sp, use_tqdm=False)
    for x, y in zip(a, b):
        cx, cy = x.outputs[0], y.outputs[0]
        assert cx.token_ids == cy.token_ids
        for lx, ly in zip(cx.logprobs, cy.logprobs):
            assert lx.keys() == ly.keys()
            for t in lx:
                assert lx[t].logprob == pytest.approx(ly[t].logprob, abs=1e-4)
        assert cx.cumulative_logprob == pytest.approx(cy.cumulative_logprob, abs=1e-3)


def test_seeded_sampling_reproduces_and_n_works(spec, prompts):
    sp = SamplingParams(n=3, temperature=0.8, top_p=0.95, seed=11, max_tokens=16)
    first = spec.generate(prompts[0], sp, use_tqdm=False)[0]
    batch = spec.generate(prompts[:4], [sp] + [SamplingParams(temperature=1.0, max_tokens=16)] * 3,
                          use_tqdm=False)[0]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in batch.outputs]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3


def test_preemption_and_prefix_cache_keep_output(tiny_dirs, prompts, reference):
    llm = LLM(tiny_dirs["llama"], max_model_len=256, kv_cache_memory_bytes=48 * 4096,
              speculative_config={"model": tiny_dirs["llama"], "num_speculative_tokens": 3,
                                  "adaptive": False})
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    m = metrics(llm)
    assert m["tandem:num_preemptions"] > 0
    assert m["tandem:prefix_cache_hits"] > 0
    assert llm.llm_engine.num_free_kv_blocks() == llm.llm_engine.num_blocks


def test_greedy_beside_sampled_requests_with_fewer_drafts(tiny_dirs, prompts):
    """Probabilistic drafting in a mixed batch: a sampled request near its max_tokens drafts
    fewer tokens than a greedy one, so the draft's later steps see greedy rows only (no q). The
    greedy request must still verify (it once failed: draft_probs had fewer rows than drafts)."""
    target = tiny_dirs["llama"]
    llm = LLM(model=target, speculative_config={"model": target,
                                                "num_speculative_tokens": 3, "adaptive": False,
                                                "draft_sample_method": "probabilistic",
                                                "rejection_sample_method": "standard"})
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=3, ignore_eos=True)
    outs = llm.generate([prompts[0], prompts[1]], [greedy, sampled], use_tqdm=False)
    plain = LLM(model=target).generate([prompts[0]], greedy, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert outs[0].outputs[0].finish_reason == "length" and len(outs[1].outputs[0].token_ids) == 3
