"""Draft proposer: runs the draft model k steps per continuing request and stores its drafts.

The draft has its own KV tensors but reads the target's block tables. Each round starts with one
"catch-up" pass over every token the draft has not yet seen as verified (usually the new token,
after a full acceptance also the last draft; after a prefix-cache hit or preemption the prompt),
then k - 1 single-token passes. Draft KV written for drafts that are later rejected is simply
overwritten by the next catch-up pass.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from tandem.core.request import Request
from tandem.sample.logits_processing import compute_probs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.sampler import sample_from_probs
from tandem.worker.model_runner import make_batch, run_model


class DraftProposer:
    def __init__(self, model: nn.Module, num_speculative_tokens: int, sample_method: str,
                 block_size: int, max_model_len: int, vocab_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.k = num_speculative_tokens
        self.probabilistic = sample_method == "probabilistic"
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size  # the target's: draft ids and q live in the target's space
        self.device = device

    def num_drafts(self, req: Request) -> int:
        """Drafts worth proposing: none past max_tokens, max_model_len, or under min_tokens."""
        p = req.params
        if not req.num_computed_tokens >= req.num_tokens - 1:
            return 0  # still in prefill
        if p.min_tokens and len(req.output_token_ids) < p.min_tokens:
            return 0  # stop tokens are masked token by token; drafts would bypass that
        left = (p.max_tokens - len(req.output_token_ids)) if p.max_tokens is not None else self.k
        return max(0, min(self.k, left - 1, self.max_model_len - req.num_tokens))

    def propose(self, reqs: list[Request], block_table: Callable[[str], list[int]]) -> None:
        """Set `spec_token_ids` (and `draft_probs`) on each request that should speculate; also
        advance the draft's KV over prompt chunks the target has computed."""
        ks = [self.num_drafts(r) for r in reqs]
        # Catch-up pass: every token with target KV (and the newest sampled one, when drafting).
        todo = [(r, block_table(r.request_id), k) for r, k in zip(reqs, ks)
                if (r.num_tokens if k else r.num_computed_tokens) > r.draft.num_computed_tokens]
        if not todo:
            return
        ends = [r.num_tokens if k else r.num_computed_tokens for r, _, k in todo]
        batch = make_batch([r.all_token_ids[r.draft.num_computed_tokens:e]
                            for (r, _, _), e in zip(todo, ends)],
                           [r.draft.num_computed_tokens for r, _, _ in todo],
                           [t for _, t, _ in todo], self.device)
        last_rows, offset = [], 0
        for q in batch.query_lens:
            offset += q
            last_rows.append(offset - 1)
        drafting = [i for i, (_, _, k) in enumerate(todo) if k > 0]
        logits = run_model(self.model, batch, self.block_size,
                           torch.tensor([last_rows[i] for i in drafting], dtype=torch.long))
        for (r, _, _), e in zip(todo, ends):
            r.draft.num_computed_tokens = e
        if not drafting:
            return
        active = [todo[i] for i in drafting]
        md = SamplingMetadata.from_params(
            [r.params for r, _, _ in active], [r.output_token_ids for r, _, _ in active],
            [r.prompt_token_ids for r, _, _ in active], [r.generator for r, _, _ in active],
            self.device)
        drafts: list[list[int]] = [[] for _ in active]
        probs: list[list[torch.Tensor]] = [[] for _ in active]
        for step in range(max(k for _, _, k in active)):
            if step > 0:
                live = [i for i, (_, _, k) in enumerate(active) if k > step]
                batch = make_batch([[drafts[i][-1]] for i in live],
                                   [active[i][0].num_tokens + step - 1 for i in live],
                                   [active[i][1] for i in live], self.device)
                logits = run_model(self.model, batch, self.block_size,
                                   torch.arange(len(live), dtype=torch.long))
                sub = md.select(live)
            else:
                live, sub = list(range(len(active))), md
            tokens, q = self._sample(logits, sub)
            for j, i in enumerate(live):
                drafts[i].append(int(tokens[j]))
                if q is not None:
                    probs[i].append(q[j])
        for i, (r, _, _) in enumerate(active):
            r.spec_token_ids = drafts[i]
            r.draft_probs = torch.stack(probs[i]) if self.probabilistic else None

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = _fit_vocab(logits, self.vocab_size)  # [B, V_target]
        if not self.probabilistic:
            return logits.argmax(dim=-1), None
        # q is exactly the distribution the draft token is drawn from; penalties are skipped
        # (any q keeps the output exact, the rejection sampler corrects for it).
        q = compute_probs(logits, md, apply_penalty=False)  # [B, V]
        return sample_from_probs(q, md.generators), q


def _fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft and target may pad their vocabularies differently; drafts never use padding ids."""
    if logits.shape[1] >= vocab_size:
        return logits[:, :vocab_size]
    pad = logits.new_full((logits.shape[0], vocab_size - logits.shape[1]), float("-inf"))
    return torch.cat([logits, pad], dim=1)
