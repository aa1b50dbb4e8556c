"""Speculative counters and the periodic log line (vLLM's format under our prefix)."""

from __future__ import annotations

import logging

from tandem.spec_decode.metrics import SpecDecodeMetrics


def test_counters_and_log_line(caplog):
    m = SpecDecodeMetrics(k=3, log_interval_s=0.0)
    m.observe(3, 3)
    m.observe(3, 1)
    m.observe(2, 0)
    values = {x.name: getattr(x, "values", getattr(x, "value", None)) for x in m.metrics()}
    assert values["tandem:spec_decode_num_drafts"] == 3
    assert values["tandem:spec_decode_num_draft_tokens"] == 8
    assert values["tandem:spec_decode_num_accepted_tokens"] == 4
    assert values["tandem:spec_decode_num_accepted_tokens_per_pos"] == [2, 1, 1]
    with caplog.at_level(logging.INFO, logger="tandem"):
        m.maybe_log()
        m.maybe_log()  # nothing new: no second line
    lines = [r.getMessage() for r in caplog.records if "SpecDecoding metrics" in r.getMessage()]
    assert lines == ["SpecDecoding metrics: Mean acceptance length: 2.33, Accepted: 4 tokens, "
                     "Drafted: 8 tokens, Per-position acceptance rate: [0.667, 0.333, 0.333], "
                     "Avg Draft acceptance rate: 50.0%"]
