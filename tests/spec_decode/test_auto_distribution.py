"""Under rejection_sample_method "auto" both kinds of request draw from the target's exact law.

The 24-token pair and exact law of the first three tokens of test_spec_distribution.py, k = 2 and
a partly-agreeing draft. Seeded and unseeded requests alternate in one generate call, so nearly
every draft, verify and plain step holds both kinds; each kind must fit the law by chi-square.
Planted bugs must fail: the standard requests verified with the first q rows of the batch (those
of the requests before them, seeded ones' one-hot fillers among them) instead of their own, and
the seeded requests' noise keyed by the row's offset inside its step instead of its position.
"""

from __future__ import annotations

import numpy as np

from tandem import LLM, SamplingParams
from tandem.sample import gumbel_verifier
from test_spec_distribution import ALPHA, PROMPT, TEMPERATURE, TOP_P, _pvalue
from test_gumbel_distribution import keys_by_offset_in_step
from test_spec_distribution import exact, pair  # noqa: F401 - fixtures

PER_KIND = 6_000  # the planted bugs are gross; both kinds pass with p well above ALPHA


def _sample(pair, monkeypatch=None) -> tuple[np.ndarray, np.ndarray, float]:  # noqa: F811
    """(seeded samples, unseeded samples, acceptance); counts the verify steps that split."""
    llm = LLM(pair[0], seed=1234, speculative_config={"model": pair[1],
                                                      "num_speculative_tokens": 2,
                                                      "adaptive": False})
    assert llm.llm_engine.config.speculative_config.rejection_sample_method == "auto"
    split = []
    rows_of = gumbel_verifier._rows_of
    if monkeypatch is not None:
        def counting(num_draft_tokens, reqs):
            split.append(len(reqs))
            return rows_of(num_draft_tokens, reqs)
        monkeypatch.setattr(gumbel_verifier, "_rows_of", counting)
    params = [SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, max_tokens=3,
                             ignore_eos=True, seed=i if i % 2 == 0 else None)
              for i in range(2 * PER_KIND)]
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    tokens = np.array([o.outputs[0].token_ids[:3] for o in outs])
    stats = [o.spec_decode_stats for o in outs]
    if monkeypatch is not None:
        assert len(split) > 10  # mixed verify steps happened
    acceptance = sum(s.num_accepted_tokens for s in stats) / sum(s.num_draft_tokens for s in stats)
    return tokens[0::2], tokens[1::2], acceptance


def test_both_kinds_match_the_target_distribution_in_one_batch(pair, exact,  # noqa: F811
                                                               monkeypatch):
    seeded, unseeded, acceptance = _sample(pair, monkeypatch)
    assert 0.1 < acceptance < 0.95  # rejections happen, so both mismatch paths are tested
    assert _pvalue(seeded, exact) > ALPHA
    assert _pvalue(unseeded, exact) > ALPHA


def test_planted_wrong_q_rows_for_standard_requests_are_detected(pair, exact,  # noqa: F811
                                                                 monkeypatch):
    rows_of = gumbel_verifier._rows_of

    def first_q_rows(num_draft_tokens, reqs):
        rows, q_rows = rows_of(num_draft_tokens, reqs)
        return rows, list(range(len(q_rows)))  # the batch's first q rows, not reqs' own

    monkeypatch.setattr(gumbel_verifier, "_rows_of", first_q_rows)
    seeded, unseeded, _ = _sample(pair)
    assert _pvalue(unseeded, exact) < ALPHA
    assert _pvalue(seeded, exact) > ALPHA  # the seeded requests read no q


def test_planted_noise_keyed_by_offset_in_step_is_detected(pair, exact,  # noqa: F811
                                                           monkeypatch):
    monkeypatch.setattr(gumbel_verifier, "row_keys", keys_by_offset_in_step)
    seeded, unseeded, _ = _sample(pair)
    assert _pvalue(seeded, exact) < ALPHA
    assert _pvalue(unseeded, exact) > ALPHA  # standard requests use no noise
