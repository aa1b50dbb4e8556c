"""Model-free drafts (a one-hot q) keep the target's exact distribution, end to end.

The 24-token llama of test_spec_distribution.py, a prompt holding every token once so the
n-gram and suffix lookups propose at every step after the first, 4,000 samples of the first
three tokens against the exact law by chi-square; planted sampler errors must fail the same test
on 3,000 (a one-hot q makes either error move the drafted token's probability by tenths).
"""

from __future__ import annotations

import numpy as np
import pytest

from tandem import LLM
from tandem.sample.rejection_sampler import RejectionSampler
from test_spec_distribution import (ALPHA, _accept_with_q_over_p, _pvalue, _resample_from_p, draw,
                                    exact_law)
from test_spec_distribution import pair  # noqa: F401 - fixture

NUM_SAMPLES = 4000
# Every token once, in a scrambled order: whatever t1 is, a lookup of it finds the tokens that
# followed it, so verification (not plain sampling) draws t2 and t3 of almost every sample.
PROMPT = [(7 * i + 3) % 24 for i in range(24)]
METHODS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
              "prompt_lookup_max": 2},
    "suffix": {"method": "suffix", "num_speculative_tokens": 2,
               "suffix_decoding_min_token_prob": 0.0},
    # beside a draft model (pair[1]) of the same vocabulary: the lookup's token is fed in the
    # draft's catch-up pass, and the second draft is read from its row where the first equals it
    "draft+ngram": {"num_speculative_tokens": 2, "lookup_method": "ngram",
                    "prompt_lookup_min": 1, "prompt_lookup_max": 2},
}


@pytest.fixture(scope="module")
def exact(pair) -> np.ndarray:  # noqa: F811
    """P(t1, t2, t3 | PROMPT) as a [V, V, V] array."""
    return exact_law(pair[0], PROMPT)


def _sample(pair: tuple[str, str], method: str, num: int = NUM_SAMPLES
            ) -> tuple[np.ndarray, float, int]:
    config = dict(METHODS[method])
    if method == "draft+ngram":  # the lookup as the draft's lookahead: the draft's own q
        config["model"] = pair[1]
    llm = LLM(pair[0], seed=1234, speculative_config={
        **config, "adaptive": False, "rejection_sample_method": "standard"})
    firsts, drafted, accepted = draw(llm, PROMPT, num)
    return firsts, accepted / drafted, drafted


@pytest.mark.parametrize("method", sorted(METHODS))
def test_model_free_samples_match_target_distribution(pair, exact, method):  # noqa: F811
    samples, acceptance, drafted = _sample(pair, method)
    assert drafted > NUM_SAMPLES  # drafts at most steps, so verification is what is tested
    assert 0.1 < acceptance < 0.95  # and both acceptance and the residual are exercised
    assert _pvalue(samples, exact) > ALPHA


@pytest.mark.parametrize("bug", ["recovery_weights", "accept_draft"])
def test_planted_sampler_errors_are_detected(pair, exact, bug, monkeypatch):  # noqa: F811
    planted = _resample_from_p if bug == "recovery_weights" else _accept_with_q_over_p
    monkeypatch.setattr(RejectionSampler, bug, staticmethod(planted))
    samples, _, _ = _sample(pair, "ngram", 3000)
    assert _pvalue(samples, exact) < ALPHA
