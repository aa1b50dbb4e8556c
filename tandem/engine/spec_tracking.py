"""What each verify step tells about speculation: the engine-wide and per-request counters, and
the origin of every token a sequence receives.

A verify step of a request with k drafts yields accepted + 1 tokens: the first `accepted` are
drafts the target accepted (origin "draft" for a draft model's, "ngram" or "suffix" for a
lookup's); the last is the target's own, either a recovered
token sampled after rejecting draft `accepted` (whose id is kept as the rejected guess) or, when
all k were accepted, the bonus token. A step without drafts yields one "target" token.
"""

from __future__ import annotations

from typing import Callable, Optional

from tandem.core.request import Request
from tandem.core.sched_output import SchedulerOutput
from tandem.spec_decode.metrics import SpecDecodeMetrics
from tandem.worker.model_runner import RunnerOutput


# A token's origin by what proposed it: "draft" for a draft model's (the name the API has
# always given it), the method's name for a lookup's.
ORIGINS = {"draft_model": "draft", "ngram": "ngram", "suffix": "suffix"}


class SpecTracker:
    def __init__(self, metrics: Optional[SpecDecodeMetrics], k: int,
                 on_verified: Optional[Callable[[int, int, bool], None]] = None) -> None:
        self.metrics = metrics
        self.k = k
        # (drafted, accepted, whether the request's previous drafts were all accepted) of each
        # verify: adaptive k
        self.on_verified = on_verified
        # this step's verified drafts and the origin of accepted ones, by request id
        self._drafts: dict[str, tuple[list[int], str]] = {}

    def record_step(self, sched: SchedulerOutput, result: RunnerOutput) -> None:
        """Before the step's tokens are appended: count drafts and acceptances."""
        self._drafts = {}
        for s in sched.scheduled:
            rid = s.request.request_id
            streak, s.request.lookup_streak = s.request.lookup_streak, False
            if s.spec_token_ids and rid in result.sampled:
                self._drafts[rid] = (s.spec_token_ids,  # read only, before the next step
                                     ORIGINS.get(s.request.draft_method, "draft"))
                accepted = len(result.sampled[rid]) - 1
                if self.metrics is not None:
                    self.metrics.observe(len(s.spec_token_ids), accepted,
                                         s.request.draft_method)
                s.request.lookup_streak = accepted == len(s.spec_token_ids)
                if self.on_verified is not None:
                    self.on_verified(len(s.spec_token_ids), accepted, streak)
                if s.request.spec_stats is not None:
                    s.request.spec_stats.record(len(s.spec_token_ids), accepted, self.k)

    def on_token(self, req: Request, j: int, result: RunnerOutput) -> None:
        """The j-th token of this step for `req` was appended: note where it came from."""
        drafts, origin = self._drafts.get(req.request_id, (None, "target"))
        last = len(result.sampled[req.request_id]) - 1
        req.token_origins.append(origin if drafts is not None and j < last else "target")
        req.rejected_drafts.append(drafts[j] if drafts is not None and j == last < len(drafts)
                                   else None)
