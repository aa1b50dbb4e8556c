"""Verification under rejection_sample_method "gumbel" (drafter-invariant, see gumbel.py), and
under "auto": seeded sampled requests as under "gumbel", every other request as under "standard".

Per request with drafts x_0..x_{k-1} and target rows 0..k (row j conditioned on x_<j, deciding
output position pos + j): the target's token at row j is y_j = argmax(log p_j + g(seed, pos + j))
(greedy rows: argmax of the penalised logits). Accept while x_j == y_j; the first mismatch, or the
bonus row after k acceptances, emits y_j. The draft's q plays no part: any draft is lossless, and
a seeded request's tokens never depend on it.
"""

from __future__ import annotations

import torch

from tandem.sample.gumbel import coupled_rows, gumbel_sample, row_keys
from tandem.sample.logits_processing import compute_probs, greedy_tokens
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rejection_sampler import (RejectionOutput, RejectionSampler, _check_inputs,
                                             _Layout, penalised_rows)


class GumbelRejectionSampler(RejectionSampler):

    def target_tokens(self, logits: torch.Tensor, md_rows: SamplingMetadata) -> torch.Tensor:
        """[R, V] penalised logits, one metadata row each -> [R] int64: the token each row's
        position takes (the same computation as the plain Sampler with gumbel)."""
        tokens = greedy_tokens(logits)                                       # [R] greedy
        if md_rows.all_greedy:
            return tokens
        rand = (md_rows.temperature != 0.0).nonzero().flatten()             # [Rr]
        sub = md_rows.select(rand.tolist())
        probs = compute_probs(logits[rand.to(logits.device)], sub, apply_penalty=False)
        tokens[rand.to(tokens.device)] = gumbel_sample(probs, row_keys(sub, logits.device))
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


class AutoRejectionSampler(RejectionSampler):
    """rejection_sample_method "auto": the requests gumbel.coupled_rows names (sampled, with their
    own seed) are verified by the gumbel rule, the rest by the standard rule with their q. Each
    kind is verified as a batch of its own; every draw is keyed by its request's seed and
    position, so a request's tokens are those its pure method gives it."""

    def __init__(self) -> None:
        self.coupled = GumbelRejectionSampler()

    def __call__(self, target_logits: torch.Tensor, num_draft_tokens: list[int],
                 draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                 md: SamplingMetadata) -> RejectionOutput:
        """As RejectionSampler.__call__; draft_probs rows of coupled requests are not read."""
        _check_inputs(target_logits, num_draft_tokens, draft_token_ids, draft_probs, md)
        coupled = coupled_rows(md, "auto")
        if not any(coupled):
            return super().__call__(target_logits, num_draft_tokens, draft_token_ids,
                                    draft_probs, md)
        if all(coupled):
            return self.coupled(target_logits, num_draft_tokens, draft_token_ids, None, md)
        token_ids: list[list[int]] = [[] for _ in coupled]
        num_accepted = [0] * len(coupled)
        for kind in (True, False):
            reqs = [i for i, c in enumerate(coupled) if c == kind]
            rows, q_rows = _rows_of(num_draft_tokens, reqs)
            device = target_logits.device
            logits = target_logits.index_select(0, torch.tensor(rows, dtype=torch.int64,
                                                                 device=device))
            args = ([num_draft_tokens[i] for i in reqs], [draft_token_ids[i] for i in reqs])
            if kind:
                res = self.coupled(logits, *args, None, md.select(reqs))
            else:
                q = (None if draft_probs is None else
                     draft_probs.index_select(0, torch.tensor(q_rows, dtype=torch.int64,
                                                              device=draft_probs.device)))
                res = super().__call__(logits, *args, q, md.select(reqs))  # q: [sum k_s, V]
            for i, toks, a in zip(reqs, res.token_ids, res.num_accepted):
                token_ids[i], num_accepted[i] = toks, a
        return RejectionOutput(token_ids=token_ids, num_accepted=num_accepted)


def _rows_of(num_draft_tokens: list[int], reqs: list[int]) -> tuple[list[int], list[int]]:
    """The target_logits rows (k_i + 1 each) and the draft_probs rows (k_i each) of requests
    `reqs`, in that order."""
    layout = _Layout.of(num_draft_tokens)
    return ([layout.row_start[i] + j for i in reqs for j in range(num_draft_tokens[i] + 1)],
            [layout.draft_start[i] + j for i in reqs for j in range(num_draft_tokens[i])])
