"""Draft proposer: runs the draft model k steps per continuing request and stores its drafts.

Each round starts with one "catch-up" pass over every position the draft has not yet computed
(usually the newest token; after an acceptance also the accepted drafts; after a prefix-cache hit,
a preemption or for a new request, its prompt), then k - 1 single-token passes. Draft KV written
for drafts that are later rejected is simply overwritten by the next catch-up pass. What the draft
reads (the target's tokens and blocks, or its own for a TLI draft) is the job of `draft_inputs`.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from tandem.core.request import Request
from tandem.sample.gumbel import coupled_rows
from tandem.sample.metadata import SamplingMetadata
from tandem.spec_decode.draft_inputs import SharedVocabDraft, TLIDraft
from tandem.worker.model_runner import ForwardBatch, make_batch


class DraftProposer:
    def __init__(self, forward: Callable[[ForwardBatch, torch.Tensor], torch.Tensor],
                 inputs: Union[SharedVocabDraft, TLIDraft], num_speculative_tokens: int,
                 max_model_len: int, draft_max_model_len: int, max_catch_up: int,
                 device: torch.device) -> None:
        self.forward = forward  # the executor's draft forward
        self.inputs = inputs
        self.k = num_speculative_tokens
        self.max_model_len = max_model_len          # the target's (drafts are target tokens)
        self.draft_max_model_len = draft_max_model_len  # in the draft's own positions
        self.max_catch_up = max_catch_up            # tokens one catch-up pass may compute
        self.device = device

    def num_drafts(self, req: Request) -> int:
        """Drafts worth proposing: none past max_tokens, max_model_len, or under min_tokens."""
        return req.drafts_allowed(self.k, self.max_model_len)

    def _plan(self, req: Request, spare: int) -> tuple[int, int]:
        """(end of this catch-up pass, number of drafts) for one request."""
        # Drafts still to verify (the step skipped it, or a preemption kept them): only catch up.
        pending = bool(req.spec_token_ids)
        k = 0 if pending else self.num_drafts(req)
        full = self.inputs.context_end(req, drafting=k > 0)
        if not pending:
            req.draft.keep_accepted(self.inputs.token_ids(req))
        k = max(0, min(k, self.draft_max_model_len - full))
        # A long context catches up over several steps before drafting; a draft without blocks
        # to spare (TLI) waits. Either way the request waits for its drafts (awaiting_drafts):
        # verifying its next position without them would change how a seeded request samples.
        end = min(full, req.draft.num_computed_tokens + self.max_catch_up)
        delivered = k > 0 and end == full and self.inputs.reserve(req, end + k - 1, spare)
        if not pending:
            req.awaiting_drafts = k > 0 and not delivered
            if not req.awaiting_drafts:
                req.steps_awaiting = 0
        if delivered:
            return end, k
        return (end, 0) if self.inputs.reserve(req, end, spare) else (req.draft.num_computed_tokens, 0)

    def propose(self, reqs: list[Request]) -> int:
        """Set `spec_token_ids` (and `draft_probs`) on each request that should speculate; also
        advance the draft's KV over prompt chunks the target has computed. Returns the number of
        draft positions computed (0: no progress was possible)."""
        plans = [self._plan(r, spare=len(reqs)) for r in reqs]
        todo = [(r, self.inputs.block_table(r), end, k) for r, (end, k) in zip(reqs, plans)
                if end > r.draft.num_computed_tokens]
        if not todo:
            return 0
        batch = make_batch([self.inputs.token_ids(r)[r.draft.num_computed_tokens:e]
                            for r, _, e, _ in todo],
                           [r.draft.num_computed_tokens for r, _, _, _ in todo],
                           [t for _, t, _, _ in todo])
        last_rows, offset = [], 0
        for q in batch.query_lens:
            offset += q
            last_rows.append(offset - 1)
        drafting = [i for i, (_, _, _, k) in enumerate(todo) if k > 0]
        logits = self.forward(batch, torch.tensor([last_rows[i] for i in drafting],
                                                  dtype=torch.long))
        computed = sum(batch.query_lens)
        if not drafting:
            self._advance(todo)
            return computed
        active = [todo[i] for i in drafting]
        md = SamplingMetadata.from_params(
            [r.params for r, *_ in active], [r.output_token_ids for r, *_ in active],
            [r.prompt_token_ids for r, *_ in active], [r.rng for r, *_ in active],
            self.device)
        drafts, probs, feeds = self._draft(active, md, logits)
        # Rows verified by token equality (gumbel.coupled_rows) keep no q, even where a mixed
        # batch computed one for them.
        coupled = coupled_rows(md, self.inputs.method)
        # State changes only now that everything succeeded: a retry after a failure (the
        # engine's fault isolation) redoes the same work, with the same keyed randomness.
        self._advance(todo)
        for i, (r, _, end, _) in enumerate(active):
            r.draft.written_at, r.draft.written_ids = end, feeds[i]
            r.spec_token_ids = drafts[i]
            r.draft_method = "draft_model"
            # q for every draft, or none: a greedy request in a mixed batch gets q rows only at
            # the steps a sampled row shared with it; its q is one-hot anyway (None).
            r.draft_probs = (torch.stack(probs[i]) if len(probs[i]) == len(drafts[i])
                             and r.params.temperature != 0 and not coupled[i] else None)
        return computed + sum(len(f) for f in feeds)

    def _draft(self, active: list, md: SamplingMetadata, logits: torch.Tensor
               ) -> tuple[list[list[int]], list[list[torch.Tensor]], list[list[int]]]:
        """k steps of drafting; step 0 samples from the catch-up pass's `logits`. Returns per
        request the drafts (target ids), their q rows, and the draft ids fed back (whose KV the
        steps wrote)."""
        drafts: list[list[int]] = [[] for _ in active]  # target ids
        probs: list[list[torch.Tensor]] = [[] for _ in active]
        feeds: list[list[int]] = [[] for _ in active]  # draft ids fed back (their KV written)
        fed: list[int] = [0] * len(active)              # the last draft id, fed to the next step
        grammars = [r.grammar for r, *_ in active]     # structured outputs walk with the drafts
        walked = [0] * len(active)
        try:
            for step in range(max(k for *_, k in active)):
                if step > 0:
                    live = [i for i, (*_, k) in enumerate(active) if k > step]
                    for i in live:
                        feeds[i].append(fed[i])
                    batch = make_batch([[fed[i]] for i in live],
                                       [active[i][2] + step - 1 for i in live],
                                       [active[i][1] for i in live])
                    logits = self.forward(batch, torch.arange(len(live), dtype=torch.long))
                    sub = md.select(live).shifted(step)  # drafting the token `step` places on
                else:
                    live, sub = list(range(len(active))), md
                masks = _grammar_masks([grammars[i] for i in live])
                draft_ids, target_ids, q = self.inputs.propose(logits, sub, masks)
                for j, (i, d, t) in enumerate(zip(live, draft_ids.tolist(),
                                                  target_ids.tolist())):
                    drafts[i].append(t)
                    fed[i] = d
                    if q is not None:
                        probs[i].append(q[j])
                    if grammars[i] is not None and grammars[i].try_consume(t):
                        walked[i] += 1
        finally:
            for grammar, n in zip(grammars, walked):
                if grammar is not None:
                    grammar.rollback(n)  # the grammar advances only on verified tokens
        return drafts, probs, feeds

    @staticmethod
    def _advance(todo: list) -> None:
        for r, _, end, _ in todo:
            r.draft.num_computed_tokens = end


def _grammar_masks(grammars: list) -> Optional[torch.Tensor]:
    """[B, V_target] bool: what each row's grammar allows next (all True without one, or where
    nothing is allowed, so the draft's q stays a distribution), or None without grammars."""
    if all(g is None for g in grammars):
        return None
    rows = [g.allowed() if g is not None else None for g in grammars]
    vocab = next(r.shape[0] for r in rows if r is not None)
    masks = torch.stack([r if r is not None else torch.ones(vocab, dtype=torch.bool)
                         for r in rows])
    masks[~masks.any(dim=-1)] = True
    return masks
