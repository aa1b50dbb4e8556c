"""Engine-wide speculative-decoding counters (vLLM's names under our prefix) and the log line."""

from __future__ import annotations

import logging
import time

from tandem.metrics import PREFIX, Metric, Vector

logger = logging.getLogger("tandem")


class SpecDecodeMetrics:
    def __init__(self, k: int, log_interval_s: float = 10.0) -> None:
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k
        # per proposer (draft_model, ngram, suffix): [verify steps, drafts, accepted drafts]
        self.by_method: dict[str, list[int]] = {}
        self.log_interval_s = log_interval_s
        self._last_log = time.monotonic()
        self._logged = (0, 0, 0)

    def observe(self, num_draft_tokens: int, num_accepted: int,
                method: str = "draft_model") -> None:
        counts = self.by_method.setdefault(method, [0, 0, 0])
        counts[0] += 1
        counts[1] += num_draft_tokens
        counts[2] += num_accepted
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    def metrics(self) -> list[Metric | Vector]:
        return [Metric(PREFIX + "spec_decode_num_drafts", self.num_drafts),
                Metric(PREFIX + "spec_decode_num_draft_tokens", self.num_draft_tokens),
                Metric(PREFIX + "spec_decode_num_accepted_tokens", self.num_accepted_tokens),
                Vector(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                       list(self.accepted_per_pos))] + [
            Metric(PREFIX + f"spec_decode_{name}_by_method", counts[i], {"method": method})
            for i, name in enumerate(("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
            for method, counts in sorted(self.by_method.items())]

    def summary(self) -> str:
        drafts = max(self.num_drafts, 1)
        rate = self.num_accepted_tokens / max(self.num_draft_tokens, 1)
        per_pos = ", ".join(f"{c / drafts:.3f}" for c in self.accepted_per_pos)
        return (f"Mean acceptance length: {1 + self.num_accepted_tokens / drafts:.2f}, "
                f"Accepted: {self.num_accepted_tokens} tokens, Drafted: {self.num_draft_tokens} "
                f"tokens, Per-position acceptance rate: [{per_pos}], "
                f"Avg Draft acceptance rate: {100 * rate:.1f}%")

    def maybe_log(self) -> None:
        now = time.monotonic()
        state = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)
        if now - self._last_log >= self.log_interval_s and state != self._logged:
            logger.info("SpecDecoding metrics: %s", self.summary())
            self._last_log, self._logged = now, state
