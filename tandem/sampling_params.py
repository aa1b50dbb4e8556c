"""SamplingParams: vLLM's per-request sampling options, validated on construction.

temperature == 0 means greedy. Every out-of-range value raises ValueError naming the field and the
allowed range, in vLLM's wording where vLLM has one.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

from tandem.sample.structured_params import StructuredOutputsParams

if TYPE_CHECKING:
    from tandem.sample.reasoning_gate import ThinkTags

# Below this a temperature is numerically unstable; vLLM clamps (0, 0.01) up to 0.01.
_MIN_TEMPERATURE = 0.01
MAX_N_SEQUENCES = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
_INT64_MAX = 2**63 - 1


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: Optional[StructuredOutputsParams] = None  # (or a dict of its fields)
    # Speculation for this request alone (tandem's; the switch is named as in vLLM's proposal):
    # none at all, or at most this many drafts per step (0: none). The engine's k still bounds.
    disable_spec_decode: bool = False
    num_speculative_tokens: Optional[int] = None
    # Filled by the engine: EOS plus generation-config stop ids, checked like stop_token_ids but
    # reported with stop_reason None (as vLLM does for EOS).
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Set by the server's reasoning parser: the grammar of structured_outputs starts after the
    # reasoning (tandem/sample/reasoning_gate.py). None: it applies from the first token.
    _think_tags: Optional[ThinkTags] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if self.top_k == -1:
            self.top_k = 0
        if 0 < self.temperature < _MIN_TEMPERATURE:
            self.temperature = _MIN_TEMPERATURE
        self._verify()
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.n > MAX_N_SEQUENCES:
            raise ValueError(f"n must be at most {MAX_N_SEQUENCES}, got {self.n}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        for name in ("top_k", "max_tokens", "min_tokens"):  # each becomes a 64-bit integer
            value = getattr(self, name)
            if value is not None and value > _INT64_MAX:
                raise ValueError(f"{name} must be at most {_INT64_MAX}, got {value}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.seed is not None and not (-_INT64_MAX - 1 <= self.seed <= _INT64_MAX):
            raise ValueError(f"seed must be a 64-bit integer, got {self.seed}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):  # the engine's max_logprobs bounds them
            value = getattr(self, name)
            if value is not None and not (value == -1 or 0 <= value <= _INT64_MAX):
                raise ValueError(f"{name} must be non-negative or -1, got {value}.")
        if not isinstance(self.disable_spec_decode, bool):
            raise ValueError(f"disable_spec_decode must be true or false, got "
                             f"{self.disable_spec_decode!r}.")
        k = self.num_speculative_tokens
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 128):
            raise ValueError(f"num_speculative_tokens must be an integer from 0 (no drafts) to "
                             f"128, got {k!r}.")
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if any(not isinstance(t, int) or not 0 <= t <= _INT64_MAX for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative 64-bit integers, got "
                             f"{self.stop_token_ids}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)
