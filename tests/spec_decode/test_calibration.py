"""Load-time calibration of adaptive speculation (engine/calibration.py): every verify size and
the draft pass timed before the first request, acceptance on a sample text kept as evidence, and
nothing else of the engine changed (counters, KV blocks, the engine's random stream, outputs)."""

from __future__ import annotations

import random

import pytest

from tandem import LLM, SamplingParams
from tandem.engine.calibration import SAMPLE_TEXT, calibrate

K = 3


@pytest.fixture(scope="module")
def calibrated(tiny_dirs) -> LLM:
    return LLM(model=tiny_dirs["llama"], seed=7,
               speculative_config={"model": tiny_dirs["llama"], "num_speculative_tokens": K,
                                   "adaptive": True})


def test_every_verify_size_and_the_draft_are_timed_at_load(calibrated):
    drafting = calibrated.llm_engine.drafting
    cal = drafting.calibration
    assert cal is not None and cal.k_max == K
    assert sorted(cal.target.sizes) == list(range(1, K + 2))  # k = 0..K at batch 1
    assert cal.draft.ready and cal.draft(1) > 0
    # A draft drafting for itself: the sample text's drafts were all accepted, at every position.
    assert all(h > 0 for h in cal.hits) and cal.misses == [0.0] * K
    # The engine's controller starts from the calibration, past its warm-up, on a copy of it.
    ad = drafting.adaptive
    assert ad is not cal and ad.target.sizes == cal.target.sizes and ad.hits == cal.hits
    assert ad.steps >= ad.warmup_steps


def test_calibration_leaves_no_trace_in_metrics_blocks_or_randomness(calibrated):
    engine = calibrated.llm_engine
    values = {m.name: getattr(m, "value", None) for m in engine.get_metrics()}
    for name in ("prompt_tokens", "generation_tokens", "request_success", "request_aborted",
                 "prefix_cache_queries", "num_preemptions", "spec_decode_num_drafts",
                 "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        assert values["tandem:" + name] == 0, name
    assert engine.num_free_kv_blocks() == engine.num_blocks
    assert not engine.parents and not engine.scheduler.requests
    assert not engine.drafting.forced
    # Unseeded requests draw their seeds from the engine's stream: calibration drew none.
    assert engine._rng.getstate() == random.Random(7).getstate()


def test_a_calibrated_engine_gives_plain_greedy_output_and_fresh_controllers(calibrated,
                                                                          tiny_dirs, prompts):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model=tiny_dirs["llama"]).generate(prompts[:3], params, use_tqdm=False)
    out = calibrated.generate(prompts[:3], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    drafting = calibrated.llm_engine.drafting
    drafting.set_policy(2, adaptive=True)  # a fresh controller: the calibration, up to k = 2
    ad = drafting.adaptive
    assert ad.k_max == 2 and len(ad.hits) == 2 and ad.target.sizes == \
        drafting.calibration.target.sizes and drafting.calibration.k_max == K
    assert ad.choose(1) in (0, 1, 2)


def test_fixed_k_engines_do_not_calibrate(tiny_dirs):
    llm = LLM(model=tiny_dirs["llama"],
              speculative_config={"model": tiny_dirs["llama"], "num_speculative_tokens": 2,
                                  "adaptive": False})
    assert llm.llm_engine.drafting.calibration is None
    assert llm.llm_engine.drafting.adaptive is None


def test_calibration_fits_a_short_max_model_len(tiny_dirs):
    """The sample text is cut to what the context allows; calibration still completes."""
    llm = LLM(model=tiny_dirs["llama"], max_model_len=40,
              speculative_config={"model": tiny_dirs["llama"], "num_speculative_tokens": 4,
                                  "adaptive": True})
    engine = llm.llm_engine
    assert len(engine.tokenizer.encode(SAMPLE_TEXT)) > 40
    assert engine.drafting.calibration is not None
    assert engine.num_free_kv_blocks() == engine.num_blocks
    calibrate(engine)  # again, on a used engine: still no trace
    assert engine.num_free_kv_blocks() == engine.num_blocks and not engine.parents


def test_under_the_defaults_seeded_requests_repeat_whatever_k_timing_picks(tiny_dirs, prompts):
    """The default configuration (adaptive k, rejection method "auto"): two fresh engines give a
    seeded request the same tokens, even when one engine's k is drawn at random every step (as
    a different clock could make adaptive choose)."""
    config = {"model": tiny_dirs["llama_other"], "num_speculative_tokens": 3}
    params = [SamplingParams(temperature=t, top_p=0.95, seed=11 + i, max_tokens=16,
                             ignore_eos=True) for i, t in enumerate((0.8, 1.0, 1.0))]
    first = LLM(tiny_dirs["llama"], speculative_config=config)
    spec = first.llm_engine.config.speculative_config
    assert spec.adaptive is True and spec.rejection_sample_method == "auto"
    second = LLM(tiny_dirs["llama"], speculative_config=config)
    rng = random.Random(5)
    second.llm_engine.drafting.adaptive.choose = lambda batch_size: rng.randint(0, 3)
    runs = [[o.outputs[0].token_ids for o in llm.generate(prompts[:3], params, use_tqdm=False)]
            for llm in (first, second)]
    assert runs[0] == runs[1]
    assert second.llm_engine.spec_metrics.num_drafts > 0  # the random ks did draft
