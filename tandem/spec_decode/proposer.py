"""Draft proposer: runs the draft model k steps per continuing request and stores its drafts.

Each round starts with one "catch-up" pass over every position the draft has not yet computed
(usually the newest token; after an acceptance also the accepted drafts; after a prefix-cache hit,
a preemption or for a new request, its prompt), then k - 1 single-token passes, fewer where a
lookup beside the draft gave the catch-up pass tokens to look ahead on and the draft's own drafts
equal them (lookahead.py). Draft KV written for drafts that are later rejected (or for lookahead
tokens past the first that differs) is simply overwritten by the next pass. What the draft
reads (the target's tokens and blocks, or its own for a TLI draft) is the job of `draft_inputs`.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable, Optional, Union

import torch

from tandem.core.request import Request
from tandem.sample.gumbel import coupled_rows
from tandem.sample.metadata import SamplingMetadata
from tandem.spec_decode.draft_inputs import SharedVocabDraft, TLIDraft
from tandem.spec_decode.lookahead import lookahead_tokens
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

    def propose(self, reqs: list[Request], hints: Optional[dict[str, list[int]]] = None
                ) -> int:
        """Set `spec_token_ids` (and `draft_probs`) on each request that should speculate; also
        advance the draft's KV over prompt chunks the target has computed. Returns the number of
        draft positions computed (0: no progress was possible).

        `hints` (request id -> tokens a lookup expects next): the catch-up pass reads them too,
        so that where the draft's own tokens turn out to equal them, their rows give the next
        drafts without a pass each (lookahead.py). The drafts are the draft model's either way."""
        plans = [self._plan(r, spare=len(reqs)) for r in reqs]
        todo = [(r, self.inputs.block_table(r), end, k) for r, (end, k) in zip(reqs, plans)
                if end > r.draft.num_computed_tokens]
        if not todo:
            return 0
        ahead = [lookahead_tokens(r, k, hints) for r, _, _, k in todo]
        batch = make_batch([self.inputs.token_ids(r)[r.draft.num_computed_tokens:e] + extra
                            for (r, _, e, _), extra in zip(todo, ahead)],
                           [r.draft.num_computed_tokens for r, _, _, _ in todo],
                           [t for _, t, _, _ in todo])
        last_rows, offset = [], 0
        for q, extra in zip(batch.query_lens, ahead):
            offset += q
            last_rows.append(offset - 1 - len(extra))  # the context's last row, then extra's
        drafting = [i for i, (_, _, _, k) in enumerate(todo) if k > 0]
        logits = self.forward(batch, torch.tensor(
            [last_rows[i] + j for i in drafting for j in range(1 + len(ahead[i]))],
            dtype=torch.long))
        computed = sum(batch.query_lens) - sum(len(extra) for extra in ahead)
        if not drafting:
            self._advance(todo)
            return computed
        active = [todo[i] for i in drafting]
        md = SamplingMetadata.from_params(
            [r.params for r, *_ in active], [r.output_token_ids for r, *_ in active],
            [r.prompt_token_ids for r, *_ in active], [r.rng for r, *_ in active],
            self.device)
        drafts, probs, feeds = self._draft(active, md, logits, [ahead[i] for i in drafting])
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

    def _draft(self, active: list, md: SamplingMetadata, logits: torch.Tensor,
               ahead: list[list[int]]
               ) -> tuple[list[list[int]], list[list[torch.Tensor]], list[list[int]]]:
        """k drafts each: the first from the catch-up pass's `logits` (each request's context
        row, then a row per token of its `ahead`), the next from the rows of `ahead` while
        the drafts equal it, then a pass per draft. Returns per request the drafts (target
        ids), their q rows, and the draft ids fed back (whose KV the passes wrote)."""
        drafts: list[list[int]] = [[] for _ in active]  # target ids
        probs: list[list[torch.Tensor]] = [[] for _ in active]
        feeds: list[list[int]] = [[] for _ in active]  # draft ids fed back (their KV written)
        fed: list[int] = [0] * len(active)              # the last draft id, fed to the next step
        grammars = [r.grammar for r, *_ in active]     # structured outputs walk with the drafts
        walked = [0] * len(active)
        first = list(accumulate((1 + len(a) for a in ahead[:-1]), initial=0))  # context rows
        try:
            # the rows of `logits` the live requests draft from (None: all, in order)
            live = list(range(len(active)))
            rows: Optional[list[int]] = first if any(ahead) else None
            while live:
                # each live request drafts its token number len(drafts[i]) + 1
                sub = md.select(live).shifted([len(drafts[i]) for i in live])
                masks = _grammar_masks([grammars[i] for i in live])
                draft_ids, target_ids, q = self.inputs.propose(
                    logits if rows is None else logits[rows], sub, masks)
                for j, (i, d, t) in enumerate(zip(live, draft_ids.tolist(),
                                                  target_ids.tolist())):
                    drafts[i].append(t)
                    fed[i] = d
                    if q is not None:
                        probs[i].append(q[j])
                    if grammars[i] is not None and grammars[i].try_consume(t):
                        walked[i] += 1
                # Rows already computed: where the drafts so far equal the lookahead's tokens,
                # the lookahead's next row is the pass this draft would be fed to.
                read = [i for i in live if len(drafts[i]) < active[i][3]
                        and drafts[i] == ahead[i][:len(drafts[i])]]
                if read:
                    for i in read:
                        feeds[i].append(fed[i])
                    live, rows = read, [first[i] + len(drafts[i]) for i in read]
                    continue
                live = [i for i, (*_, k) in enumerate(active) if len(drafts[i]) < k]
                if not live:
                    break
                for i in live:
                    feeds[i].append(fed[i])
                batch = make_batch([[fed[i]] for i in live],
                                   [active[i][2] + len(drafts[i]) - 1 for i in live],
                                   [active[i][1] for i in live])
                logits = self.forward(batch, torch.arange(len(live), dtype=torch.long))
                rows = None
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
