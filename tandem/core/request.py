"""Request: one sequence's state inside the engine (tokens, progress, drafts, stop status)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from tandem.logprob_rows import LogprobRows
from tandem.outputs import Logprob, SpecDecodeRequestStats
from tandem.sample.random import SeededRandom
from tandem.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # failed inside an engine step; the rest of the batch went on

    @property
    def finished(self) -> bool:
        return self is not RequestStatus.WAITING and self is not RequestStatus.RUNNING


@dataclass
class DraftState:
    """The draft model's view of a request. A draft that shares the target's tokenizer reads the
    target's tokens and block table, so only its progress is kept here. A draft with another
    tokenizer (TLI) keeps its own token ids, translated from the target's (their count differs
    when a target token re-encodes to several draft tokens), and its own blocks, which the KV
    cache manager holds beside the target's."""
    num_computed_tokens: int = 0   # draft positions whose KV is in the draft's cache
    token_ids: list[int] = field(default_factory=list)  # TLI only: the draft's own sequence
    num_target_tokens: int = 0     # TLI only: target tokens already translated into token_ids
    # The drafts whose KV the last round wrote (positions written_at, written_at + 1, ...): the
    # part of them that was accepted needs no recomputing.
    written_at: int = 0
    written_ids: list[int] = field(default_factory=list)

    def reset(self) -> None:
        """The draft's KV is gone (preemption, or its blocks were reclaimed)."""
        self.num_computed_tokens = 0
        self.written_ids = []

    def keep_accepted(self, token_ids: list[int]) -> None:
        """Advance over the written drafts that `token_ids` (the draft's sequence) confirms."""
        if self.written_ids and self.num_computed_tokens == self.written_at:
            n = 0
            for a, b in zip(token_ids[self.written_at:], self.written_ids):
                if a != b:
                    break
                n += 1
            self.num_computed_tokens += n
        self.written_ids = []


@dataclass(eq=False)  # identity: the scheduler looks requests up in lists
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    rng: SeededRandom                 # keyed randomness (seed, position, purpose)
    eos_token_id: Optional[int] = None
    prompt: Optional[str] = None
    parent_id: Optional[str] = None   # for n > 1, the user's request id
    index: int = 0                    # choice index within the parent
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0      # tokens whose target KV is in the cache
    num_cached_tokens: int = 0        # prompt tokens served by the prefix cache
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: Union[int, str, None] = None
    spec_token_ids: list[int] = field(default_factory=list)   # drafts to verify next step
    awaiting_drafts: bool = False  # should verify drafts next, but the draft could not make them
    steps_awaiting: int = 0        # steps sat out waiting for them
    draft_probs: Optional[torch.Tensor] = None                # [k, V] q of each draft, or None
    draft_method: str = "draft_model"  # what proposed spec_token_ids: draft_model, ngram, suffix
    lookup_streak: bool = False  # its last verified drafts were accepted whole (adaptive k)
    draft: DraftState = field(default_factory=DraftState)
    spec_stats: Optional[SpecDecodeRequestStats] = None
    grammar: Optional[Any] = None     # a GrammarMatcher (structured outputs), or None
    # per output token: its origin ("target", or the proposer of an accepted draft: "draft",
    # "ngram", "suffix"), and the draft it replaced (a rejected guess) if any
    # (engine/spec_tracking.py)
    token_origins: list[str] = field(default_factory=list)
    rejected_drafts: list[Optional[int]] = field(default_factory=list)
    logprobs: LogprobRows = field(default_factory=LogprobRows)  # flat; dicts built when read
    prompt_logprobs: list[Optional[dict[int, Logprob]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    block_hashes: list[bytes] = field(default_factory=list)
    # time.monotonic() stamps for the latency metrics (engine/latency_metrics.py)
    arrival_time: float = 0.0
    scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def finish_reason(self) -> Optional[str]:
        return self.status.value if self.status.finished else None

    def drafts_allowed(self, k: int, max_model_len: int) -> int:
        """Drafts worth proposing (at most k, and at most the request's own cap): none in
        prefill, past max_tokens or max_model_len, under min_tokens, or where the request
        turned speculation off."""
        p = self.params
        if p.disable_spec_decode:
            return 0
        if p.num_speculative_tokens is not None:
            k = min(k, p.num_speculative_tokens)  # the request's own cap
        if not self.num_computed_tokens >= self.num_tokens - 1:
            return 0  # still in prefill
        if p.min_tokens and len(self.output_token_ids) < p.min_tokens:
            return 0  # stop tokens are masked token by token; drafts would bypass that
        left = (p.max_tokens - len(self.output_token_ids)) if p.max_tokens is not None else k
        return max(0, min(k, left - 1, max_model_len - self.num_tokens))

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
