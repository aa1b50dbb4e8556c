"""A user request inside the engine: n child sequences sharing one prompt, and its outputs."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

from tandem.core.request import Request
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.outputs import CompletionOutput, RequestOutput


@dataclass
class RequestGroup:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    children: list[Request]
    final_only: bool  # build an output only when every child is done (the offline API)
    detoks: dict[str, IncrementalDetokenizer] = field(default_factory=dict)
    num_finished: int = 0

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.children)

    def make_output(self) -> RequestOutput:
        """A snapshot: every list and stats object is a copy the engine will not touch again."""
        completions = []
        for c in self.children:
            detok = self.detoks[c.request_id]
            want_lp = c.params.logprobs is not None
            completions.append(CompletionOutput(
                index=c.index, text=detok.visible_text(c.status.finished),
                token_ids=list(c.output_token_ids),
                cumulative_logprob=c.cumulative_logprob if want_lp else None,
                logprobs=list(c.logprobs) if want_lp else None,
                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                spec_decode_stats=copy.deepcopy(c.spec_stats)))
        first = self.children[0]
        plp = list(first.prompt_logprobs) if first.params.prompt_logprobs is not None else None
        return RequestOutput(request_id=self.request_id, prompt=self.prompt,
                             prompt_token_ids=self.prompt_token_ids, prompt_logprobs=plp,
                             outputs=completions, finished=self.finished,
                             num_cached_tokens=first.num_cached_tokens)
