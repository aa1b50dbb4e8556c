"""Scheduler: decides each step how many tokens every request computes.

There is no prefill or decode phase: a request has `num_computed_tokens` and a target of
`num_tokens_with_spec` (known tokens plus drafts to verify), and the scheduler closes the gap under
a token budget. That covers chunked prefill, prefix-cache hits, decode, and verification of drafts.
Running requests go first; when blocks run out, the most recently admitted request is preempted
(its blocks freed, to be recomputed later). Waiting requests are admitted in arrival order.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from tandem.config import SchedulerConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.request import Request, RequestStatus
from tandem.core.sched_output import ScheduledRequest, SchedulerOutput


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def finish_request(self, req: Request, status: RequestStatus) -> None:
        """End a request (stop, length or abort) and free its blocks."""
        req.status = status
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        self.requests.pop(req.request_id, None)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.draft.reset()
        req.spec_token_ids, req.draft_probs = [], None
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        lookahead = self.config.num_lookahead_tokens
        scheduled_ids: set[str] = set()

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self.kv.allocate_slots(req, num_new, lookahead):
                if self._reclaim_draft_blocks():
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status is RequestStatus.WAITING:  # preempted itself: nothing left to evict
                break
            out.scheduled.append(self._scheduled(req, num_new))
            scheduled_ids.add(req.request_id)
            budget -= num_new
            i += 1

        while (self.waiting and budget > 0 and not out.preempted
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            hits, num_hit = self.kv.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, budget)
            if not self.kv.allocate_slots(req, num_new, lookahead, hits):
                break
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            req.num_cached_tokens = max(req.num_cached_tokens, num_hit)
            if not self.config.draft_has_own_blocks:
                req.draft.num_computed_tokens = num_hit  # the draft's KV is in the hit blocks
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(self._scheduled(req, num_new))
            budget -= num_new
        return out

    def _reclaim_draft_blocks(self) -> bool:
        """Free the draft blocks (TLI) of the newest request holding any: the target's progress
        comes first, and the draft recomputes its context later. False when none are held."""
        for req in reversed(self.running):
            if self.kv.free_draft(req.request_id):
                req.draft.reset()
                return True
        return False

    def _scheduled(self, req: Request, num_new: int) -> ScheduledRequest:
        # Drafts that did not fit in the budget are dropped (the known tokens always come first).
        num_known = req.num_tokens - req.num_computed_tokens
        num_spec = max(0, num_new - num_known)
        if num_spec < len(req.spec_token_ids):
            req.spec_token_ids = req.spec_token_ids[:num_spec]
            if req.draft_probs is not None:
                req.draft_probs = req.draft_probs[:num_spec]
        return ScheduledRequest(req, num_new, list(req.spec_token_ids),
                                self.kv.block_table(req.request_id))

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]],
                           check_stop: Callable[[Request], Optional[RequestStatus]],
                           on_token: Callable[[Request, int, int], None]) -> list[Request]:
        """Append sampled tokens, roll back rejected drafts, apply stop checks, free finished
        requests. `on_token(req, index_in_step, token)` records per-token extras (logprobs).
        Returns the requests that progressed."""
        progressed: list[Request] = []
        for s in out.scheduled:
            req = s.request
            if req.status.finished or req.request_id not in self.requests:
                continue  # aborted while the step ran
            req.num_computed_tokens += s.num_new_tokens
            tokens = sampled.get(req.request_id, [])
            num_drafts = len(s.spec_token_ids)
            if num_drafts:
                # Tokens after the first rejected draft were computed on wrong inputs: forget them.
                req.num_computed_tokens -= num_drafts - (len(tokens) - 1)
            req.spec_token_ids, req.draft_probs = [], None
            if not tokens:
                continue  # a prompt chunk that does not complete the prompt
            progressed.append(req)
            for j, token in enumerate(tokens):
                req.append_token(token)
                on_token(req, j, token)
                status = check_stop(req)
                if status is not None:
                    self.finish_request(req, status)
                    break
            if not req.status.finished:
                self.kv.cache_blocks(req, self.cacheable_tokens(req))
        return progressed

    def cacheable_tokens(self, req: Request) -> int:
        """Tokens whose KV is final in every model that reads the blocks."""
        if self.config.num_speculative_tokens and not self.config.draft_has_own_blocks:
            return min(req.num_computed_tokens, req.draft.num_computed_tokens)
        return req.num_computed_tokens
