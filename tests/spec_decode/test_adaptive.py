"""Adaptive speculation: the expected-tokens-per-cost choice on given measurements, probing, and
the engine with a useless draft (drafting switched off, output unchanged)."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.spec_decode.adaptive import AdaptiveK


def _measured(k_max: int, rate: float, target_ms: tuple[float, float], draft_ms: float,
              batch: int = 1) -> AdaptiveK:
    """An AdaptiveK past warm-up that has seen target steps cost a + b * tokens ms, draft passes
    `draft_ms`, and every position accepted with probability `rate` (given the earlier ones)."""
    ad = AdaptiveK(k_max, warmup_steps=0)
    a, b = target_ms
    for n in (batch, batch * (k_max + 1), batch * 2):
        ad.observe_target(n, (a + b * n) / 1000)
    ad.observe_draft(batch, 1, draft_ms / 1000)
    ad.rates = [rate] * k_max
    return ad


def test_expected_tokens_is_one_plus_the_survival_sum() -> None:
    ad = AdaptiveK(3)
    ad.rates = [0.5, 0.5, 1.0]
    assert ad.expected_tokens(0) == 1
    assert ad.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.25)


def test_a_cheap_good_draft_drafts_k_and_a_useless_one_none() -> None:
    assert _measured(5, 0.9, (20, 0.1), draft_ms=1).choose(1) == 5
    assert _measured(5, 0.0, (20, 0.1), draft_ms=1).choose(1) == 0
    # A draft as costly as the target pays only if nearly always right.
    assert _measured(5, 0.6, (20, 0.0), draft_ms=20).choose(1) == 0


def test_the_best_k_follows_the_batch_size() -> None:
    # Verifying costs 2 ms per token: at batch 1 the fixed 20 ms dominates and k = 3 pays; at
    # batch 64 each extra draft position costs 128 ms of target time and drafting does not.
    ad = _measured(4, 0.7, (20, 2.0), draft_ms=2, batch=1)
    assert ad.choose(1) == 3   # E(3) / C(3) = 2.53 / 34 ms beats E(4) / C(4) = 2.77 / 38 ms
    ad.observe_draft(64, 1, 0.004)
    assert ad.choose(64) < 2


def test_probes_draft_one_more_and_back_off_while_nothing_changes() -> None:
    ad = _measured(3, 0.0, (20, 0.1), draft_ms=5)
    ad.probe_interval = ad.base_probe_interval = 2
    ks = [ad.choose(1) for _ in range(40)]
    # settled on 0; a probe at k = 1 after 2 steps, then after 4, 8 and 16 more
    assert [i for i, k in enumerate(ks) if k] == [2, 6, 14, 30] and set(ks) == {0, 1}
    ad.rates = [0.9, 0.9, 0.9]  # the draft became good: drafting resumes at once
    assert ad.choose(1) == 3


def test_acceptance_estimates_follow_observations() -> None:
    ad = AdaptiveK(3, decay=0.5)
    ad.observe_acceptance(3, 1)        # position 0 accepted, 1 rejected, 2 not tried
    assert ad.rates == [1.0, 0.0, None]
    ad.observe_acceptance(3, 3)
    assert ad.rates == [1.0, 0.5, 1.0]


def test_engine_with_a_useless_draft_stops_drafting_and_keeps_the_output(tiny_dirs, prompts):
    target, other = tiny_dirs["llama"], tiny_dirs["llama_other"]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    plain = LLM(model=target).generate(prompts[:3], params, use_tqdm=False)
    llm = LLM(model=target, speculative_config={"model": other, "num_speculative_tokens": 4,
                                                "adaptive": True})
    chosen: list[int] = []
    ad = llm.llm_engine.drafting.adaptive
    choose = ad.choose
    ad.choose = lambda b: chosen.append(choose(b)) or chosen[-1]
    out = llm.generate(prompts[:3], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    after_warmup = chosen[ad.warmup_steps:]
    assert after_warmup and after_warmup.count(0) / len(after_warmup) > 0.8, chosen


def test_adaptive_must_be_a_bool(tiny_llama):
    with pytest.raises(ValueError, match="adaptive must be true or false"):
        LLM(model=tiny_llama, speculative_config={"model": tiny_llama,
                                                  "num_speculative_tokens": 2,
                                                  "adaptive": "yes"})
