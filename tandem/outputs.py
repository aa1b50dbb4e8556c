"""What the engine returns: RequestOutput / CompletionOutput (vLLM's shapes) and per-request
speculative-decoding statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional, Union


@dataclass(slots=True)  # no __dict__: a third smaller, for dicts built of many
class Logprob:
    """Log probability of one token, its rank in the distribution (1 = most likely) and its text."""
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One entry per position: token id -> Logprob (the chosen token plus the top-k alternatives);
# the engine's are `LogprobRows` (logprob_rows.py), which build each dict when it is read.
SampleLogprobs = Sequence[dict[int, Logprob]]
# The first prompt position has no logprob, hence Optional.
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class SpecDecodeRequestStats:
    """Per-request speculative-decoding statistics."""
    num_spec_steps: int = 0          # verification steps that carried drafts
    num_draft_tokens: int = 0        # drafted tokens proposed for this request
    num_accepted_tokens: int = 0     # drafted tokens accepted
    # acceptance_histogram[i] = steps in which exactly i drafts were accepted (length k + 1)
    acceptance_histogram: list[int] = field(default_factory=list)

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification step, bonus token included (1 + accepted / steps)."""
        return 1.0 + self.num_accepted_tokens / self.num_spec_steps if self.num_spec_steps else 0.0

    def record(self, num_drafted: int, num_accepted: int, k: int) -> None:
        self.num_spec_steps += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.acceptance_histogram) < k + 1:
            self.acceptance_histogram.extend([0] * (k + 1 - len(self.acceptance_histogram)))
        self.acceptance_histogram[num_accepted] += 1

    def merge(self, other: SpecDecodeRequestStats) -> None:
        self.num_spec_steps += other.num_spec_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        n = max(len(self.acceptance_histogram), len(other.acceptance_histogram))
        self.acceptance_histogram = [
            (self.acceptance_histogram[i] if i < len(self.acceptance_histogram) else 0)
            + (other.acceptance_histogram[i] if i < len(other.acceptance_histogram) else 0)
            for i in range(n)]

    def to_dict(self) -> dict[str, Union[int, float, list[int]]]:
        return {
            "num_spec_steps": self.num_spec_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": self.num_accepted_tokens,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_histogram": list(self.acceptance_histogram),
        }


@dataclass
class CompletionOutput:
    """One completion so far. In the running outputs of `tandem serve`'s API process the lists
    (token ids, origins, rejected ids) are read-only `PrefixView` sequences, taken in O(1) each
    step; a finished output and the offline engine's outputs carry lists. Logprobs are always
    a `LogprobRows` (a running output's: a read-only view of the rows so far)."""
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: Union[int, str, None] = None  # the stop string or stop token id that matched
    spec_decode_stats: Optional[SpecDecodeRequestStats] = None
    # per token: "draft" (an accepted draft of a draft model), "ngram" or "suffix" (an accepted
    # lookup draft) or "target" (recovered after a rejection, a bonus token, or a step without
    # drafts), and the rejected draft's id where there was one
    token_origins: list[str] = field(default_factory=list)
    rejected_draft_ids: list[Optional[int]] = field(default_factory=list)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    error: Optional[str] = None  # the request failed inside the engine (the others went on)

    @property
    def spec_decode_stats(self) -> Optional[SpecDecodeRequestStats]:
        """Statistics summed over this request's completions (None without speculation)."""
        stats = [o.spec_decode_stats for o in self.outputs if o.spec_decode_stats is not None]
        if not stats:
            return None
        total = SpecDecodeRequestStats()
        for s in stats:
            total.merge(s)
        return total
