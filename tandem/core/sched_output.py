"""The scheduler's decision for one step, handed to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.core.request import Request


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int          # tokens computed this step (prompt chunk, or 1 + len(spec_token_ids))
    spec_token_ids: list[int]    # drafts verified this step (the tail of the new tokens)
    block_table: list[int]

    @property
    def start(self) -> int:
        """Position of the first new token."""
        return self.request.num_computed_tokens

    @property
    def token_ids(self) -> list[int]:
        req = self.request
        known = req.all_token_ids[self.start:self.start + self.num_new_tokens - len(self.spec_token_ids)]
        return known + self.spec_token_ids

    @property
    def completes_prompt(self) -> bool:
        """After this step every known token has KV, so the last position yields a new token."""
        return self.start + self.num_new_tokens - len(self.spec_token_ids) >= self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.scheduled)
