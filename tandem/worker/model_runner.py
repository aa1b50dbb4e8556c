"""Model runner: SchedulerOutput -> flat tensors -> target forward -> logits -> sampled tokens.

One forward pass covers every scheduled request: prompt chunks, single decode tokens, and
verification of `1 + k` tokens (last token plus drafts). Logits are computed only for the rows
that need them. Requests with drafts go through the rejection sampler, the rest through the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from tandem.attention.context import forward_context
from tandem.attention.metadata import build_attention_metadata
from tandem.core.request import Request
from tandem.core.sched_output import ScheduledRequest, SchedulerOutput
from tandem.logprob_rows import LogprobChunk, LogprobRows, TokenTexts
from tandem.outputs import Logprob
from tandem.sample.logprobs import LogprobsTensors, compute_logprobs
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rejection_sampler import RejectionSampler
from tandem.sample.sampler import Sampler


@dataclass
class RunnerOutput:
    sampled: dict[str, list[int]] = field(default_factory=dict)        # request id -> new tokens
    logprobs: dict[str, LogprobChunk] = field(default_factory=dict)  # row j: sampled token j
    prompt_logprobs: dict[str, list[Optional[dict[int, Logprob]]]] = field(default_factory=dict)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor   # [T] int64, on the host
    positions: torch.Tensor   # [T] int64, on the host
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]


def run_model(model: nn.Module, batch: ForwardBatch, block_size: int,
              logits_rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Forward `batch` through `model` on `device` and return logits for the flat rows
    `logits_rows` (the path off the Triton route: worker/graph_runner.py chooses)."""
    meta = build_attention_metadata(batch.query_lens, batch.seq_lens, batch.block_tables,
                                    block_size, device)
    with forward_context(meta), torch.inference_mode():
        hidden = model(batch.input_ids.to(device), batch.positions.to(device))  # [T, hidden]
        # index_select, not fancy indexing: the latter is several times slower on CPU. Callers
        # build the row list on the host; on CUDA it must follow the hidden states there.
        rows = logits_rows.to(hidden.device, non_blocking=True)
        return model.compute_logits(hidden.index_select(0, rows)).float()  # [N, vocab]


def make_batch(token_ids: list[list[int]], starts: list[int],
               block_tables: list[list[int]]) -> ForwardBatch:
    """Request i computes token_ids[i] at positions starts[i], starts[i] + 1, ... The tensors
    stay on the host: the graph runner copies them into its device buffers, or run_model moves
    them (nothing is read back from a device)."""
    flat_ids: list[int] = []
    positions: list[int] = []
    for ids, start in zip(token_ids, starts):
        flat_ids.extend(ids)
        positions.extend(range(start, start + len(ids)))
    return ForwardBatch(torch.tensor(flat_ids, dtype=torch.long),
                        torch.tensor(positions, dtype=torch.long),
                        [len(ids) for ids in token_ids],
                        [s + len(ids) for ids, s in zip(token_ids, starts)], block_tables)


class ModelRunner:
    def __init__(self, forward: Callable[[ForwardBatch, torch.Tensor], torch.Tensor],
                 device: torch.device, vocab_size: int, tokenizer,
                 rejection_sampler: Optional[RejectionSampler] = None,
                 sampler: Optional[Sampler] = None) -> None:
        # the executor's target forward: its graph runner (every rank, in lockstep)
        self.forward = forward
        self.device = device
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)  # decoded_token of logprobs, decoded once
        self.sampler = sampler or Sampler()
        self.rejection_sampler = rejection_sampler or RejectionSampler()  # or gumbel, synthetic

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        out = RunnerOutput()
        items = sched.scheduled
        batch = make_batch([s.token_ids for s in items], [s.start for s in items],
                           [s.block_table for s in items])
        # Which flat rows need logits: all verified positions of requests with drafts, the last
        # position of requests whose prompt is complete, every position for prompt logprobs.
        rows: list[int] = []
        sample_items: list[tuple[ScheduledRequest, int]] = []  # (item, first logits row of it)
        prompt_lp_items: list[tuple[ScheduledRequest, int]] = []
        offset = 0
        for s in items:
            n = s.num_new_tokens
            if s.request.params.prompt_logprobs is not None and s.start < s.request.num_prompt_tokens:
                prompt_lp_items.append((s, len(rows)))
                rows.extend(range(offset, offset + n))
                if s.completes_prompt:
                    sample_items.append((s, len(rows) - 1))
            elif s.completes_prompt:
                k = len(s.spec_token_ids)
                sample_items.append((s, len(rows)))
                rows.extend(range(offset + n - k - 1, offset + n))
            offset += n
        if not rows:
            self.forward(batch, torch.zeros(0, dtype=torch.long))
            return out
        logits = self.forward(batch, torch.tensor(rows, dtype=torch.long))  # host: no sync
        logits = logits[:, :self.vocab_size]
        logits = _apply_grammars(logits, sample_items)
        for s, first in prompt_lp_items:
            out.prompt_logprobs[s.request.request_id] = self._prompt_logprobs(s, logits, first)
        if sample_items:
            self._sample(sample_items, logits, out)
        return out

    # -- sampling ------------------------------------------------------------------------------
    def _sample(self, items: list[tuple[ScheduledRequest, int]], logits: torch.Tensor,
                out: RunnerOutput) -> None:
        reqs = [s.request for s, _ in items]
        md = SamplingMetadata.from_params(
            [r.params for r in reqs], [r.output_token_ids for r in reqs],
            [r.prompt_token_ids for r in reqs], [r.rng for r in reqs], self.device)
        counts = [len(s.spec_token_ids) for s, _ in items]
        rows = [first + j for (s, first), k in zip(items, counts) for j in range(k + 1)]
        row_index = torch.tensor(rows, dtype=torch.long, device=self.device)
        # Every row, in order, contiguous, and no min_tokens mask to write: the logits as they
        # are (a copy of [B, V] is 1 MB a row for Gemma's vocabulary, 3% of its one-stream step).
        whole = (rows == list(range(logits.shape[0])) and logits.is_contiguous()
                 and not any(_below_min_tokens(r) for r in reqs))
        target = _mask_min_tokens(logits if whole else logits.index_select(0, row_index), reqs,
                                  counts)  # [sum(k+1), V]
        if any(counts):
            draft_probs = _draft_probs(items, counts, target.shape[1], self.device)
            res = self.rejection_sampler(target, counts, [s.spec_token_ids for s, _ in items],
                                         draft_probs, md)
            tokens = res.token_ids
        else:
            tokens = [[t] for t in self.sampler(target, md).sampled_token_ids.tolist()]
        row = 0
        for (s, _), k, toks in zip(items, counts, tokens):
            req = s.request
            out.sampled[req.request_id] = toks
            if req.params.logprobs is not None:
                lp = compute_logprobs(logits[row_index[row:row + len(toks)]],
                                      torch.tensor(toks, device=self.device), req.params.logprobs)
                out.logprobs[req.request_id] = lp.chunk()
            row += k + 1

    def _prompt_logprobs(self, s: ScheduledRequest, logits: torch.Tensor,
                         first: int) -> list[Optional[dict[int, Logprob]]]:
        """Logprob of each prompt token given its prefix (position i predicts token i + 1)."""
        req = s.request
        n = min(s.num_new_tokens, req.num_prompt_tokens - s.start)
        nxt = req.prompt_token_ids[s.start + 1:s.start + n + 1]
        result: list[Optional[dict[int, Logprob]]] = [None] if s.start == 0 else []
        if nxt:
            lp = compute_logprobs(logits[first:first + len(nxt)],
                                  torch.tensor(nxt, device=self.device), req.params.prompt_logprobs)
            result.extend(self._to_dicts(lp))
        return result

    def _to_dicts(self, lp: LogprobsTensors) -> list[dict[int, Logprob]]:
        """Prompt logprobs as dicts, built as the sample logprobs' rows build theirs."""
        rows, chunk = LogprobRows(self.token_texts), lp.chunk()
        for j in range(len(chunk.ranks)):
            rows.append_row(chunk, j)
        return list(rows)


def _apply_grammars(logits: torch.Tensor,
                    items: list[tuple[ScheduledRequest, int]]) -> torch.Tensor:
    """Structured outputs: each verified position's logits masked to what its grammar allows
    after the drafts before it, before sampling and logprobs (the rejection sampler then sees
    the masked target distribution, which it reproduces exactly)."""
    if all(s.request.grammar is None for s, _ in items):
        return logits
    logits = logits.clone()  # [N, V]; the forward's output is an inference tensor
    for s, first in items:
        grammar = s.request.grammar
        if grammar is None:
            continue
        masks = grammar.masks(s.spec_token_ids).to(logits.device)   # [k + 1, V]
        if not bool(masks[0].any()):
            raise ValueError("the grammar allows no next token")
        rows = logits[first:first + masks.shape[0]]
        rows.masked_fill_(~masks[:, :rows.shape[1]], float("-inf"))
    return logits


def _draft_probs(items: list[tuple[ScheduledRequest, int]], counts: list[int], vocab_size: int,
                 device: torch.device) -> Optional[torch.Tensor]:
    """[sum(k), V] q of every draft, or None when all were drafted greedily. A greedy draft's q is
    one-hot at the draft (drafts of a batch may come from greedy and from sampling rows)."""
    reqs = [s.request for s, _ in items]
    if all(r.draft_probs is None for r, k in zip(reqs, counts) if k):
        return None
    parts = []
    for (s, _), r, k in zip(items, reqs, counts):
        if not k:
            continue
        if r.draft_probs is not None:
            parts.append(r.draft_probs[:k])
        else:
            ids = torch.tensor(s.spec_token_ids, dtype=torch.int64, device=device)
            parts.append(torch.nn.functional.one_hot(ids, vocab_size).float())
    return torch.cat(parts)


def _below_min_tokens(req: Request) -> bool:
    return bool(req.params.min_tokens) and len(req.output_token_ids) < req.params.min_tokens


def _mask_min_tokens(logits: torch.Tensor, reqs: list[Request], counts: list[int]) -> torch.Tensor:
    """Forbid stop tokens while a request is below min_tokens (such requests carry no drafts)."""
    row = 0
    for req, k in zip(reqs, counts):
        p = req.params
        if _below_min_tokens(req):
            stop_ids = set(p._all_stop_token_ids)
            if req.eos_token_id is not None and not p.ignore_eos:
                stop_ids.add(req.eos_token_id)
            ids = [t for t in stop_ids if t < logits.shape[1]]
            if ids:
                logits[row, ids] = float("-inf")  # `logits` is already a gathered copy
        row += k + 1
    return logits
