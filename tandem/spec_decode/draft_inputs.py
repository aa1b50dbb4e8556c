"""What the draft model reads and where it writes, for each kind of draft.

`SharedVocabDraft`: a draft with the target's tokenizer reads the target's token ids and block
tables, and its ids are target ids (only padded vocabularies may differ).
Under rejection_sample_method "gumbel" both propose the Gumbel-max of q with the noise the target
reads at the same output position (sample/gumbel.py), keyed by target token ids, and keep no q;
under "auto" the sampled rows of seeded requests do so, and the other rows draft as "standard".
`TLIDraft`: a draft with another tokenizer keeps its own token sequence (translated from the
target's by `TargetToDraft`) and blocks of its own, proposes only inside the vocabulary
intersection, and hands the verifier target ids and q placed in the target's vocabulary.

Both answer the same questions for the proposer: how far the draft's context reaches, which
tokens and block table to run, and how logits become (draft ids, target ids, q).
"""

from __future__ import annotations

from typing import Optional

import torch

from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.request import Request
from tandem.sample.gumbel import coupled_rows, gumbel_sample, row_keys
from tandem.sample.logits_processing import compute_probs, greedy_tokens
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.random import Purpose
from tandem.sample.sampler import sample_by_method
from tandem.spec_decode.draft_feedback import TargetToDraft
from tandem.spec_decode.vocab_mapping import VocabMapping

# (draft ids [B], target ids [B], q [B, V_target] or None for greedy drafting)
Proposal = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


class SharedVocabDraft:
    def __init__(self, kv: KVCacheManager, target_vocab_size: int, probabilistic: bool,
                 method: str = "standard") -> None:
        self.kv = kv
        self.vocab_size = target_vocab_size
        self.probabilistic = probabilistic
        # The rejection method: the rows it couples (gumbel.coupled_rows) propose the Gumbel-max
        # of q with the target's noise and keep no q.
        self.method = method

    def context_end(self, req: Request, drafting: bool) -> int:
        """Positions the draft's KV must cover before it drafts: the target's computed tokens
        (prefill runs in step with the target), and the newest sampled token when drafting."""
        return req.num_tokens if drafting else req.num_computed_tokens

    def token_ids(self, req: Request) -> list[int]:
        return req.all_token_ids

    def block_table(self, req: Request) -> list[int]:
        return self.kv.block_table(req.request_id)

    def reserve(self, req: Request, num_positions: int, spare: int) -> bool:
        return True  # the scheduler's lookahead slots hold the draft's writes

    def propose(self, logits: torch.Tensor, md: SamplingMetadata,
                masks: Optional[torch.Tensor] = None) -> Proposal:
        """`masks`: [B, V_target] bool, what structured outputs allow (None: everything)."""
        logits = _fit_vocab(logits, self.vocab_size)  # [B, V_target]
        if masks is not None:
            logits = logits.masked_fill(~masks.to(logits.device), float("-inf"))
        if not self.probabilistic or md.all_greedy:  # q would be one-hot at the argmax
            ids = greedy_tokens(logits)
            return ids, ids, None
        # q is exactly the distribution the draft token is drawn from; penalties are skipped
        # (any q keeps the output exact, the rejection sampler corrects for it).
        q = compute_probs(logits, md, apply_penalty=False)  # [B, V]
        ids = sample_by_method(q, md, self.method, Purpose.DRAFT,
                               lambda q_c, md_c: _gumbel_draft(q_c, md_c, None))
        return ids, ids, q if _needs_q(md, self.method) else None


class TLIDraft:
    def __init__(self, kv: KVCacheManager, mapping: VocabMapping, feedback: TargetToDraft,
                 probabilistic: bool, method: str = "standard") -> None:
        self.kv = kv
        self.mapping = mapping
        self.feedback = feedback
        self.probabilistic = probabilistic
        self.method = method  # as SharedVocabDraft's
        self.outside = ~mapping.draft_mask  # [V_draft] True where the draft may not propose

    def context_end(self, req: Request, drafting: bool) -> int:
        """Translate the target tokens the draft has not yet seen; returns the length of the
        draft's own sequence, which its KV must cover before drafting."""
        d = req.draft
        upto = req.num_tokens if drafting else req.num_computed_tokens
        if upto > d.num_target_tokens:
            new = req.all_token_ids[d.num_target_tokens:upto]
            d.token_ids += (self.feedback.prompt(new) if d.num_target_tokens == 0
                            else self.feedback.tokens(new))
            d.num_target_tokens = upto
        return len(d.token_ids)

    def token_ids(self, req: Request) -> list[int]:
        return req.draft.token_ids

    def block_table(self, req: Request) -> list[int]:
        return self.kv.draft_block_table(req.request_id)

    def reserve(self, req: Request, num_positions: int, spare: int) -> bool:
        return self.kv.allocate_draft_slots(req.request_id, num_positions, spare)

    def propose(self, logits: torch.Tensor, md: SamplingMetadata,
                masks: Optional[torch.Tensor] = None) -> Proposal:
        """Draft only inside the intersection (and, with structured outputs, inside what the
        grammar allows: `masks` [B, V_target]): greedy takes the argmax there; probabilistic
        samples the request's temperature/top-k/top-p distribution of the masked logits, and
        that exact distribution, placed in target ids (zero elsewhere), is q."""
        m = self.mapping
        outside = self.outside.unsqueeze(0)                               # [1, V_draft]
        if masks is not None:  # a target id's permission, read through the twin map
            masks = masks.to(logits.device)[:, m.draft_to_target.clamp(min=0)]  # [B, V_draft]
            blocked = outside | ~masks
            blocked[blocked.all(dim=-1)] = outside[0]  # nothing allowed: keep q a distribution
            outside = blocked
        logits = logits[:, :m.draft_vocab_size].masked_fill(outside, float("-inf"))
        if not self.probabilistic or md.all_greedy:  # q would be one-hot at the argmax
            draft_ids = greedy_tokens(logits)                         # [B]
            return draft_ids, m.draft_to_target[draft_ids], None
        q_draft = compute_probs(logits, md, apply_penalty=False)      # [B, V_draft], 0 outside I
        # Coupled rows: draft token d reads the noise of its twin d2t[d], the target token it
        # proposes, so q close to p picks the token p picks. Tokens outside I have q = 0 (log
        # -inf) and never read noise (their -1 twin is clamped only to keep the gather valid).
        twins = m.draft_to_target.clamp(min=0)
        draft_ids = sample_by_method(q_draft, md, self.method, Purpose.DRAFT,
                                     lambda q_c, md_c: _gumbel_draft(q_c, md_c, twins))  # [B]
        if not _needs_q(md, self.method):
            return draft_ids, m.draft_to_target[draft_ids], None
        q = q_draft.new_zeros(q_draft.shape[0], m.target_vocab_size)  # [B, V_target]
        q.index_copy_(1, m.target_ids, q_draft.index_select(1, m.draft_ids))
        return draft_ids, m.draft_to_target[draft_ids], q


def _needs_q(md: SamplingMetadata, method: str) -> bool:
    """Whether a sampled row the method does not couple is in the batch: only such rows are
    verified against q (coupled rows by token equality, greedy rows by the argmax). Coupled
    rows' q rows in a mixed batch are their real q, but the proposer keeps none for them."""
    coupled = coupled_rows(md, method)
    return any(t != 0.0 and not c for t, c in zip(md.temperature.tolist(), coupled))


def _gumbel_draft(q: torch.Tensor, md: SamplingMetadata,
                  token_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """[B, V] draft distribution -> [B] int64 its Gumbel-max with each row's noise at its position
    (the noise the target's token there reads); greedy rows have a one-hot q: its argmax."""
    return gumbel_sample(q, row_keys(md, q.device), token_ids)


def _fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft and target may pad their vocabularies differently; drafts never use padding ids."""
    if logits.shape[1] >= vocab_size:
        return logits[:, :vocab_size]
    pad = logits.new_full((logits.shape[0], vocab_size - logits.shape[1]), float("-inf"))
    return torch.cat([logits, pad], dim=1)
