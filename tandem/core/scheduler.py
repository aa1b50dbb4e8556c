"""Scheduler: decides each step how many tokens every request computes.

There is no prefill or decode phase: a request has `num_computed_tokens` and a target of
`num_tokens_with_spec` (known tokens plus drafts to verify), and the scheduler closes the gap under
a token budget. That covers chunked prefill, prefix-cache hits, decode, and verification of drafts.
Running requests go first; when blocks run out, the most recently admitted request is preempted
(its blocks freed, to be recomputed later). Waiting requests are admitted in arrival order, the
preempted ones first, and beside running requests only while `watermark` of the blocks stay free.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from tandem.config import SchedulerConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.request import Request, RequestStatus
from tandem.core.sched_output import ScheduledRequest, SchedulerOutput

# A request waits at most this many steps for drafts the draft cannot make yet (a TLI draft short
# of memory, or catching up on a long context) before it goes on without them.
MAX_STEPS_AWAITING_DRAFTS = 8


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # Blocks a waiting request must leave free beside running ones (vLLM's watermark).
        self.watermark_blocks = int(config.watermark * kv.num_blocks)
        # Told of every request that ends, however (a model-free proposer drops its index, and
        # suffix decoding keeps the output for later requests).
        self.on_finish: Optional[Callable[[Request], None]] = None

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
        if self.on_finish is not None:
            self.on_finish(req)

    def _preempt(self, req: Request) -> None:
        """Free the request's blocks; it recomputes later. Its pending drafts are kept, so the
        positions they cover are still verified against them (a seeded request's tokens must not
        depend on whether it was preempted)."""
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.draft.reset()
        req.awaiting_drafts, req.steps_awaiting = False, 0
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    # -- one step ------------------------------------------------------------------------------
    def schedule(self, force: bool = False) -> SchedulerOutput:
        """Requests waiting for drafts (`awaiting_drafts`) sit out the step (a few steps at most),
        unless `force`: the engine forces a step when the draft can make no progress."""
        return self._schedule(skip_awaiting=not force)

    def _num_new(self, req: Request, computed: int, budget: int) -> int:
        """Tokens to compute this step: all of them up to and with the drafts when they fit;
        otherwise a chunk that stops short of the last known token. Drafts are never cut, nor
        replaced by a plain sample: how a position is decided must not depend on the budget."""
        total = req.num_tokens_with_spec - computed
        if total <= budget:
            return total
        if not req.spec_token_ids:
            return budget
        return min(budget, req.num_tokens - 1 - computed)

    def _schedule(self, skip_awaiting: bool) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        lookahead = self.config.num_lookahead_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if skip_awaiting and req.awaiting_drafts \
                    and req.steps_awaiting < MAX_STEPS_AWAITING_DRAFTS:
                req.steps_awaiting += 1
                i += 1
                continue
            num_new = self._num_new(req, req.num_computed_tokens, budget)
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
            budget -= num_new
            i += 1

        # The watermark (vLLM's; 0, off, by default): beside running requests, a waiting one
        # is admitted only if it leaves that many blocks free. Without it a cache overfilled by
        # growing requests readmits a preempted request as soon as it fits, which is at once
        # where its context lies in cached blocks of requests with the same prompt, and
        # preempting it again frees few blocks (they are shared): 9,148 preemptions at 256
        # streams of 2,048 tokens in the default 4 GiB (benchmarks/LOG.md).
        while (self.waiting and budget > 0 and not out.preempted
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            hits, num_hit = self.kv.get_computed_blocks(req)
            num_new = self._num_new(req, num_hit, budget)
            reserve = self.watermark_blocks if self.running else 0
            if num_new <= 0 or not self.kv.allocate_slots(req, num_new, lookahead, hits,
                                                          reserve):
                break
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            req.num_cached_tokens = max(req.num_cached_tokens, num_hit)
            if self.config.draft_kv == "shared":
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
        # _num_new either reaches every draft or stops before the last known token.
        spec = list(req.spec_token_ids) if num_new > req.num_tokens - req.num_computed_tokens \
            else []
        return ScheduledRequest(req, num_new, spec, self.kv.block_table(req.request_id))

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]],
                           check_stop: Callable[[Request], Optional[RequestStatus]],
                           on_token: Callable[[Request, int, int], None],
                           on_error: Callable[[Request, BaseException], None]) -> list[Request]:
        """Append sampled tokens, roll back rejected drafts, apply stop checks, free finished
        requests. `on_token(req, index_in_step, token)` records per-token extras (logprobs);
        a request whose update raises goes to `on_error`. Returns the requests that progressed."""
        progressed: list[Request] = []
        for s in out.scheduled:
            req = s.request
            if req.status.finished or req.request_id not in self.requests:
                continue  # aborted (or failed) while the step ran
            try:
                if self._update(req, s, sampled.get(req.request_id, []), check_stop, on_token):
                    progressed.append(req)
            except Exception as error:  # noqa: BLE001 - that request fails, the others go on
                on_error(req, error)
        return progressed

    def _update(self, req: Request, s: ScheduledRequest, tokens: list[int],
                check_stop: Callable[[Request], Optional[RequestStatus]],
                on_token: Callable[[Request, int, int], None]) -> bool:
        req.num_computed_tokens += s.num_new_tokens
        num_drafts = len(s.spec_token_ids)
        if num_drafts:
            # Tokens after the first rejected draft were computed on wrong inputs: forget them.
            req.num_computed_tokens -= num_drafts - (len(tokens) - 1)
            req.spec_token_ids, req.draft_probs = [], None
        if not tokens:
            return False  # a prompt chunk that does not complete the prompt
        for j, token in enumerate(tokens):
            req.append_token(token)
            on_token(req, j, token)
            status = check_stop(req)
            if status is not None:
                self.finish_request(req, status)
                break
        if not req.status.finished:
            self.kv.cache_blocks(req, self.cacheable_tokens(req))
        return True

    def cacheable_tokens(self, req: Request) -> int:
        """Tokens whose KV is final in every model that reads the blocks."""
        if self.config.num_speculative_tokens and self.config.draft_kv == "shared":
            return min(req.num_computed_tokens, req.draft.num_computed_tokens)
        return req.num_computed_tokens
