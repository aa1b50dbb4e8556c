"""Request: one sequence's state inside the engine (tokens, progress, drafts, stop status)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from tandem.outputs import Logprob, SpecDecodeRequestStats
from tandem.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort")


@dataclass
class DraftState:
    """The draft model's view of a request. Today the draft shares the target's tokens and block
    table, so only its progress differs; a draft with another tokenizer will keep its own token ids
    here."""
    num_computed_tokens: int = 0


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
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
    draft_probs: Optional[torch.Tensor] = None                # [k, V] q of each draft, or None
    draft: DraftState = field(default_factory=DraftState)
    spec_stats: Optional[SpecDecodeRequestStats] = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[Optional[dict[int, Logprob]]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    block_hashes: list[bytes] = field(default_factory=list)

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

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
