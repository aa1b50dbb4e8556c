"""Lossless verification of draft tokens (Leviathan et al., arXiv 2211.17192).

Per request with drafts x_0..x_{k-1} and target rows p_0..p_k (row j conditioned on x_<j):
  greedy: accept while x_j == argmax p_j; the first mismatch emits argmax p_j and stops.
  random: accept x_j with probability min(1, p_j(x_j) / q_j(x_j)); the first rejection emits a
          sample of normalize(max(p_j - q_j, 0)) and stops. q is one-hot on x_j for greedy drafting.
  all k accepted: a bonus token from p_k.
Randomness is keyed (sample/random.py): the draft at output position t is tested with the
request's ACCEPT uniform at t, and the token emitted at t (recovered or bonus) uses its SAMPLE
uniform at t, whatever else is in the batch and however the steps were scheduled; greedy requests
use none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.sample.logits_processing import apply_penalties, compute_probs, greedy_tokens
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.random import Purpose
from tandem.sample.sampler import inverse_cdf


@dataclass
class RejectionOutput:
    token_ids: list[list[int]]  # per request: accepted drafts, then the recovered or bonus token
    num_accepted: list[int]     # per request: number of drafts accepted (len(token_ids[i]) - 1)


@dataclass
class _Layout:
    """Where request i lives: target rows row_start[i] .. row_start[i] + k_i (bonus last), and
    draft slots draft_start[i] .. draft_start[i] + k_i - 1 (draft_probs rows, flat draft arrays)."""
    row_start: list[int]
    draft_start: list[int]
    num_drafts: int

    @classmethod
    def of(cls, num_draft_tokens: list[int]) -> _Layout:
        row_start, draft_start, rows, drafts = [], [], 0, 0
        for k in num_draft_tokens:
            row_start.append(rows)
            draft_start.append(drafts)
            rows, drafts = rows + k + 1, drafts + k
        return cls(row_start, draft_start, drafts)


class RejectionSampler:

    @staticmethod
    def accept_draft(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """[D] float64 each -> [D] bool. P(u < p/q) = min(1, p/q) for u ~ U[0, 1); a draft q gave
        no mass cannot have been drawn from q, and a token p gives no mass is never accepted."""
        return (q_x > 0) & (u * q_x < p_x)

    @staticmethod
    def recovery_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """[N, V] unnormalised distribution of the token emitted on a rejection: max(p - q, 0),
        or p itself where that residual is all zero (p == q up to rounding)."""
        residual = (p - q).clamp_min(0.0)                          # [N, V]
        empty = residual.sum(dim=-1, keepdim=True) <= 0.0          # [N, 1]
        return torch.where(empty, p, residual)

    def __call__(self, target_logits: torch.Tensor, num_draft_tokens: list[int],
                 draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                 md: SamplingMetadata) -> RejectionOutput:
        """target_logits: [sum(k_i + 1), V] raw; per request its k_i draft rows then a bonus row.
        draft_probs: [sum(k_i), V] the q each draft was drawn from, or None (greedy drafting).
        md: one row per request."""
        _check_inputs(target_logits, num_draft_tokens, draft_token_ids, draft_probs, md)
        if not num_draft_tokens:
            return RejectionOutput(token_ids=[], num_accepted=[])
        layout = _Layout.of(num_draft_tokens)
        is_greedy = [t == 0.0 for t in md.temperature.tolist()]
        random_reqs = [i for i, greedy in enumerate(is_greedy) if not greedy]

        logits, md_rows = penalised_rows(target_logits, num_draft_tokens, draft_token_ids, md)
        target_argmax = greedy_tokens(logits)                           # [R]
        probs = None if md.all_greedy else compute_probs(logits, md_rows, apply_penalty=False)

        uniforms = _accept_uniforms(md, num_draft_tokens, random_reqs, layout, logits.device)
        accepted = self._accepted(target_argmax, probs, draft_token_ids, draft_probs, is_greedy,
                                  layout, uniforms)
        num_accepted = []
        for i, k in enumerate(num_draft_tokens):  # length of the accepted prefix
            s, a = layout.draft_start[i], 0
            while a < k and accepted[s + a]:
                a += 1
            num_accepted.append(a)

        final_rows = [layout.row_start[i] + a for i, a in enumerate(num_accepted)]
        final = target_argmax[torch.tensor(final_rows, device=logits.device)].tolist()  # greedy
        if random_reqs:
            final_u = md.select(random_reqs).uniforms(
                Purpose.SAMPLE, [num_accepted[i] for i in random_reqs])      # [Rr]
            sampled = self._sample_final(probs, final_rows, num_accepted, num_draft_tokens,
                                         draft_token_ids, draft_probs, random_reqs, layout, final_u)
            for i, token in zip(random_reqs, sampled):
                final[i] = token
        token_ids = [list(draft_token_ids[i][:a]) + [final[i]] for i, a in enumerate(num_accepted)]
        return RejectionOutput(token_ids=token_ids, num_accepted=num_accepted)

    def _accepted(self, target_argmax: torch.Tensor, probs: torch.Tensor | None,
                  draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                  is_greedy: list[bool], layout: _Layout, uniforms: torch.Tensor) -> list[bool]:
        """Acceptance of every draft independently (flat, [D]); prefixes are taken by the caller."""
        if layout.num_drafts == 0:
            return []
        device, vocab_size = target_argmax.device, (probs.shape[-1] if probs is not None else 0)
        drafts = torch.tensor([t for d in draft_token_ids for t in d], dtype=torch.int64,
                              device=device)                                          # [D]
        rows = torch.tensor([layout.row_start[i] + j for i, d in enumerate(draft_token_ids)
                             for j in range(len(d))], dtype=torch.int64, device=device)  # [D]
        accept = target_argmax[rows] == drafts  # greedy rule; never true for an invalid id
        if probs is not None:
            greedy = torch.tensor([is_greedy[i] for i, d in enumerate(draft_token_ids)
                                   for _ in d], device=device)                        # [D]
            valid = (drafts >= 0) & (drafts < vocab_size)
            safe = drafts.clamp(0, vocab_size - 1)
            p_x = probs[rows, safe].double()                                          # [D]
            if draft_probs is None:
                q_x = torch.ones_like(p_x)  # greedy drafting: q is one-hot on the draft
            else:
                q_x = draft_probs[torch.arange(layout.num_drafts, device=device), safe].double()
            rand_accept = valid & self.accept_draft(p_x, q_x, uniforms)
            accept = torch.where(greedy, accept, rand_accept)
        return accept.tolist()

    def _sample_final(self, probs: torch.Tensor, final_rows: list[int], num_accepted: list[int],
                      num_draft_tokens: list[int], draft_token_ids: list[list[int]],
                      draft_probs: torch.Tensor | None, random_reqs: list[int], layout: _Layout,
                      final_u: torch.Tensor) -> list[int]:
        """The recovered (after a rejection) or bonus (all accepted) token of each random request."""
        device, vocab_size = probs.device, probs.shape[-1]
        weights = probs[torch.tensor([final_rows[i] for i in random_reqs], device=device)]
        # [Rr, V]; a bonus row samples p_k as it is, a rejected row its residual.
        rejected = [(r, i) for r, i in enumerate(random_reqs)
                    if num_accepted[i] < num_draft_tokens[i]]
        if rejected:
            rej_r = torch.tensor([r for r, _ in rejected], device=device)                # [J]
            if draft_probs is not None:
                q_rows = [layout.draft_start[i] + num_accepted[i] for _, i in rejected]
                q = draft_probs[torch.tensor(q_rows, device=device)].float()            # [J, V]
            else:
                x = torch.tensor([draft_token_ids[i][num_accepted[i]] for _, i in rejected],
                                 dtype=torch.int64, device=device)                       # [J]
                # One-hot q; an out-of-vocabulary draft subtracts nothing.
                q = torch.nn.functional.one_hot(x.clamp(0, vocab_size - 1), vocab_size).float()
                q *= ((x >= 0) & (x < vocab_size)).unsqueeze(1)
            weights[rej_r] = self.recovery_weights(weights[rej_r], q)
        return inverse_cdf(weights, final_u).tolist()


def penalised_rows(target_logits: torch.Tensor, num_draft_tokens: list[int],
                   draft_token_ids: list[list[int]], md: SamplingMetadata
                   ) -> tuple[torch.Tensor, SamplingMetadata]:
    """The verify rows' float logits [R, V] with penalties applied, and their metadata: row j of
    request i decides its position as if drafts[:j] were already generated (expand does both)."""
    md_rows = md.expand([k + 1 for k in num_draft_tokens],
                        [[list(d[:j]) for j in range(k + 1)]
                         for d, k in zip(draft_token_ids, num_draft_tokens)])
    logits = target_logits.float()                                      # [R, V]
    if not md.no_penalties:
        logits = apply_penalties(logits, md_rows)
    return logits, md_rows


def _accept_uniforms(md: SamplingMetadata, num_draft_tokens: list[int], random_reqs: list[int],
                     layout: _Layout, device: torch.device) -> torch.Tensor:
    """[D] float64: the ACCEPT uniform of every draft of a random request at its output position
    (greedy requests' slots hold 0 and are never read)."""
    values = [0.0] * layout.num_drafts
    for i in random_reqs:
        rng, pos, s = md.rngs[i], md.positions[i], layout.draft_start[i]
        for j in range(num_draft_tokens[i]):
            values[s + j] = rng.uniform(pos + j, Purpose.ACCEPT)
    return torch.tensor(values, dtype=torch.float64, device=device)


def _check_inputs(target_logits: torch.Tensor, num_draft_tokens: list[int],
                  draft_token_ids: list[list[int]], draft_probs: torch.Tensor | None,
                  md: SamplingMetadata) -> None:
    num_reqs = len(num_draft_tokens)
    if md.num_rows != num_reqs or len(draft_token_ids) != num_reqs:
        raise ValueError(f"need one metadata row and one draft list per request ({num_reqs}), got "
                         f"{md.num_rows} and {len(draft_token_ids)}.")
    for i, (k, d) in enumerate(zip(num_draft_tokens, draft_token_ids)):
        if k < 0 or len(d) != k:
            raise ValueError(f"request {i}: num_draft_tokens={k} but {len(d)} draft ids.")
    total_rows = sum(num_draft_tokens) + num_reqs
    if target_logits.shape[0] != total_rows:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, expected "
                         f"sum(k_i + 1) = {total_rows}.")
    if draft_probs is not None and tuple(draft_probs.shape) != (sum(num_draft_tokens),
                                                                target_logits.shape[-1]):
        raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected "
                         f"({sum(num_draft_tokens)}, {target_logits.shape[-1]}).")
