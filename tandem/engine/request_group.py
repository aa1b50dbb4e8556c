"""A user request inside the engine: n child sequences sharing one prompt, and its outputs.

Children are created as they are needed, at most `window` unfinished at a time: a request with
n = 10,000 neither allocates ten thousand sequences at once nor holds every batch slot; requests
that arrive after it queue beside its next children instead of behind all of them.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tandem.core.request import Request
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.outputs import CompletionOutput, RequestOutput
from tandem.sampling_params import SamplingParams


@dataclass
class RequestGroup:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    final_only: bool  # build an output only when every child is done (the offline API)
    window: int       # most children unfinished at once
    grammar: Optional[Any] = None  # the compiled grammar of structured outputs (a prototype)
    arrival_time: float = field(default_factory=time.monotonic)
    children: list[Request] = field(default_factory=list)  # created so far, in index order
    detoks: dict[str, IncrementalDetokenizer] = field(default_factory=dict)
    num_finished: int = 0
    error: Optional[str] = None  # set when the request failed inside the engine
    stream_interval: int = 1  # a streamed request's output every this many tokens (and the ends)
    tokens_sent: int = 0  # its longest child's output tokens when its last output went out

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def finished(self) -> bool:
        return self.error is not None or self.num_finished == self.n

    def output_due(self) -> bool:
        """Whether a step that changed this request sends its output, noting what it sends: a
        final-only request's when it has finished; a streamed one's at its first output, when it
        has finished, and otherwise once its longest child has `stream_interval` tokens more than
        at the last (as vLLM's --stream-interval, where each of n choices is a request of its
        own: the first token is never held back, and n choices in step come N tokens a chunk)."""
        if self.finished:
            return True
        if self.final_only:
            return False
        if self.stream_interval == 1:
            return True
        made = max(len(c.output_token_ids) for c in self.children)
        if self.tokens_sent and made - self.tokens_sent < self.stream_interval:
            return False
        self.tokens_sent = made
        return True

    def spawn(self, make_child: Callable[[RequestGroup, int], Request]) -> list[Request]:
        """Create the children the window has room for (the first call creates the first ones)."""
        room = self.window - (len(self.children) - self.num_finished)
        new = [make_child(self, i) for i in
               range(len(self.children), min(self.n, len(self.children) + max(0, room)))]
        self.children.extend(new)
        return new

    def make_output(self) -> RequestOutput:
        """A snapshot: every list and stats object is a copy the engine will not touch again (the
        logprobs a view of rows the engine only appends to). Children not created yet are left
        out until the final output."""
        completions = []
        for c in self.children:
            detok = self.detoks[c.request_id]
            want_lp = c.params.logprobs is not None
            completions.append(CompletionOutput(
                index=c.index, text=detok.visible_text(c.status.finished),
                token_ids=list(c.output_token_ids),
                cumulative_logprob=c.cumulative_logprob if want_lp else None,
                logprobs=c.logprobs.view() if want_lp else None,  # rows only grow: O(1)
                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                spec_decode_stats=copy.deepcopy(c.spec_stats),
                token_origins=list(c.token_origins),
                rejected_draft_ids=list(c.rejected_drafts)))
        first = self.children[0] if self.children else None
        want_plp = first is not None and first.params.prompt_logprobs is not None
        return RequestOutput(request_id=self.request_id, prompt=self.prompt,
                             prompt_token_ids=self.prompt_token_ids,
                             prompt_logprobs=list(first.prompt_logprobs) if want_plp else None,
                             outputs=completions, finished=self.finished,
                             num_cached_tokens=first.num_cached_tokens if first else 0,
                             error=self.error)
