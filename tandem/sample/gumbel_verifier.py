"""Verification under rejection_sample_method "gumbel" (drafter-invariant, see gumbel.py).

Per request with drafts x_0..x_{k-1} and target rows 0..k (row j conditioned on x_<j, deciding
output position pos + j): the target's token at row j is y_j = argmax(log p_j + g(seed, pos + j))
(greedy rows: argmax of the penalised logits). Accept while x_j == y_j; the first mismatch, or the
bonus row after k acceptances, emits y_j. The draft's q plays no part: any draft is lossless, and
a seeded request's tokens never depend on it.
"""

from __future__ import annotations

import torch

from tandem.sample.gumbel import gumbel_argmax, row_keys
from tandem.sample.logits_processing import compute_probs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rejection_sampler import (RejectionOutput, RejectionSampler, _check_inputs,
                                             penalised_rows)


class GumbelRejectionSampler(RejectionSampler):

    def target_tokens(self, logits: torch.Tensor, md_rows: SamplingMetadata) -> torch.Tensor:
        """[R, V] penalised logits, one metadata row each -> [R] int64: the token each row's
        position takes (the same computation as the plain Sampler with gumbel)."""
        tokens = logits.argmax(dim=-1)                                       # [R] greedy
        if md_rows.all_greedy:
            return tokens
        rand = (md_rows.temperature != 0.0).nonzero().flatten()             # [Rr]
        sub = md_rows.select(rand.tolist())
        probs = compute_probs(logits[rand.to(logits.device)], sub, apply_penalty=False)
        tokens[rand.to(tokens.device)] = gumbel_argmax(torch.log(probs),
                                                       row_keys(sub, logits.device))
        return tokens

    def __call__(self, target_logits: torch.Tensor, num_draft_tokens: list[int],
                 draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                 md: SamplingMetadata) -> RejectionOutput:
        """As RejectionSampler.__call__; draft_probs is checked but not needed."""
        _check_inputs(target_logits, num_draft_tokens, draft_token_ids, draft_probs, md)
        if not num_draft_tokens:
            return RejectionOutput(token_ids=[], num_accepted=[])
        logits, md_rows = penalised_rows(target_logits, num_draft_tokens, draft_token_ids, md)
        target = self.target_tokens(logits, md_rows).tolist()                # [R]
        token_ids, num_accepted, row = [], [], 0
        for drafts in draft_token_ids:
            a = 0
            while a < len(drafts) and drafts[a] == target[row + a]:
                a += 1
            token_ids.append(list(drafts[:a]) + [target[row + a]])
            num_accepted.append(a)
            row += len(drafts) + 1
        return RejectionOutput(token_ids=token_ids, num_accepted=num_accepted)
