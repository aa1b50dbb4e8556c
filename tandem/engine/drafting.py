"""The engine's drafting phase: after each step, the proposer drafts for the running requests,
with k fixed, or chosen per step by adaptive speculation from measured costs and acceptance."""

from __future__ import annotations

import copy
import time
from collections import deque
from typing import Callable, Optional

from tandem.core.request import Request
from tandem.core.sched_output import SchedulerOutput
from tandem.engine.fault_isolation import propose_isolated
from tandem.spec_decode.adaptive import AdaptiveK
from tandem.spec_decode.model_free import ModelFreeProposer, Proposer
from tandem.spec_decode.schedule import BatchSizeSchedule


class Drafting:
    def __init__(self, proposer: Proposer, adaptive: bool,
                 fail: Callable[[Request, BaseException], None],
                 schedule: Optional[BatchSizeSchedule] = None) -> None:
        self.proposer = proposer
        # A lookup without a draft model proposes only where it finds a match (model_free.py)
        self.model_free = isinstance(proposer, ModelFreeProposer)
        self.k_max = proposer.k
        self.k = proposer.k  # the policy's fixed k (or adaptive's upper bound)
        # num_speculative_tokens_per_batch_size: caps each step's k (fixed or adaptive's choice)
        # by the number of running requests.
        self.schedule = schedule
        self.adaptive: Optional[AdaptiveK] = AdaptiveK(proposer.k) if adaptive else None
        # What load-time calibration measured (engine/calibration.py): costs at every verify
        # size and the draft's, and acceptance on a sample text. A fresh controller starts here.
        self.calibration: Optional[AdaptiveK] = None
        self.forced: deque[int] = deque()  # k for the coming steps, ahead of any policy
        self.fail = fail
        # Whether the last target step was decode/verify only. After a prefill the draft, too,
        # runs over a prompt, and neither cost says what drafting k tokens costs.
        self._decoding = False

    def set_policy(self, k: int, adaptive: bool = False) -> None:
        """From the next step on: draft k tokens per step (k = 0: no drafting at all, plain
        decoding), or with `adaptive`, let a fresh controller choose 0..k each step. For `tandem
        bench spec`, which compares policies on one engine: on a shared machine, separate
        processes running the same configuration differed in speed by more than the policies
        being compared. Requests in flight keep their state; every step stays lossless."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.k_max:
            raise ValueError(f"k must be an integer from 0 to num_speculative_tokens "
                             f"({self.k_max}), got {k!r}")
        if adaptive and k == 0:
            raise ValueError("adaptive speculation needs k >= 1")
        self.proposer.k = self.k = k
        if self.model_free:
            self.proposer.by_streak = None
        self.adaptive = self.fresh_controller(k) if adaptive else None
        self._decoding = False

    def fresh_controller(self, k: int) -> AdaptiveK:
        """A controller choosing 0..k, starting from the load-time calibration where there is
        one (what a fresh engine starts from), else from its priors."""
        if self.calibration is None:
            return AdaptiveK(k)
        return copy.deepcopy(self.calibration).restricted(k)

    def catch_up(self, running: list[Request]) -> int:
        """When every runnable request waits for drafts: let the draft run alone."""
        return propose_isolated(self.proposer, running, self.fail)

    def after_step(self, running: list[Request]) -> None:
        by_streak: Optional[tuple[int, int]] = None  # a lookup's k per request state
        if self.forced:
            k = self.forced.popleft()
        elif self.adaptive is None:
            k = self.k
        elif self.model_free:
            streak = sum(r.lookup_streak for r in running)
            by_streak = self.adaptive.choose_lookup(len(running) - streak, streak)
            k = max(by_streak)
        else:
            k = self.adaptive.choose(len(running))
        if self.schedule is not None:
            k = min(k, self.schedule.cap(len(running)))
        if self.model_free:
            self.proposer.by_streak = by_streak
        if k == 0:  # drafting is off, or plain decoding pays more now: skip the draft entirely
            for req in running:
                req.awaiting_drafts = False
            return
        self.proposer.k = k
        if self.adaptive is None:
            propose_isolated(self.proposer, running, self.fail)
            return
        t0 = time.perf_counter()
        computed = propose_isolated(self.proposer, running, self.fail)
        # A lookup's time is no price of k (it looks once whatever k is, and a new request's
        # first lookup builds its index, 40 ms for 16 suffix trees of 300 tokens): its cost stays
        # the calibration's.
        if self._decoding and computed > 0 and not self.model_free:
            self.adaptive.observe_draft(len(running), k, time.perf_counter() - t0)
        if self.model_free:  # how often the lookup finds something, for the cost of k
            decoding = [r for r in running
                        if not r.status.finished and r.num_computed_tokens >= r.num_tokens - 1]
            self.adaptive.observe_proposals(
                [self.proposer.asked(r) for r in decoding],
                [len(r.spec_token_ids) for r in decoding],
                [r.lookup_streak for r in decoding])

    def observe_target(self, sched: SchedulerOutput, seconds: float) -> None:
        if self.adaptive is None:
            return
        self._decoding = all(s.num_new_tokens == 1 + len(s.spec_token_ids)
                             for s in sched.scheduled)
        if self._decoding:
            self.adaptive.observe_target(sum(s.num_new_tokens for s in sched.scheduled),
                                         seconds, len(sched.scheduled))

    def observe_acceptance(self, num_drafted: int, num_accepted: int, streak: bool = False
                           ) -> None:
        if self.adaptive is not None:  # a lookup's evidence by request state (choose_lookup)
            self.adaptive.observe_acceptance(num_drafted, num_accepted,
                                             streak and self.model_free)
