"""Outputs as deltas across the engine channel.

The engine's `RequestOutput`s are cumulative; sending them whole each step would cost the square
of the length. `DeltaEncoder` (engine side) sends only what is new since the last message for a
request, `OutputAssembler` (API side) rebuilds the same cumulative `RequestOutput`s. Token ids,
logprobs and token origins only grow; text grows too, except that the text visible while running
holds back a tail that may start a stop string (never shown, so never taken back): a delta still
says where its text starts, so the client never depends on that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from tandem.outputs import CompletionOutput, Logprob, RequestOutput, SpecDecodeRequestStats

# (token id, logprob, rank, decoded token) for each entry of a position's logprobs
WireLogprobs = list[tuple[int, float, Optional[int], Optional[str]]]


@dataclass
class CompletionDelta:
    index: int
    text_start: int            # the client keeps text[:text_start] and appends text
    text: str
    token_start: int           # where token_ids (and logprobs, origins) continue
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[list[WireLogprobs]]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]
    spec_stats: Optional[tuple[int, int, int, list[int]]]
    from_draft: list[bool]     # token origins: True for an accepted draft
    rejected_draft_ids: list[Optional[int]]


@dataclass
class OutputDelta:
    request_id: str
    finished: bool
    error: Optional[str]
    num_cached_tokens: int
    prompt_token_ids: Optional[list[int]]  # in a request's first delta only
    prompt_logprobs_start: int
    prompt_logprobs: Optional[list[Optional[WireLogprobs]]]
    completions: list[CompletionDelta]     # the completions that changed


def _wire_logprobs(entry: Optional[dict[int, Logprob]]) -> Optional[WireLogprobs]:
    if entry is None:
        return None
    return [(t, lp.logprob, lp.rank, lp.decoded_token) for t, lp in entry.items()]


def _logprobs(entry: Optional[WireLogprobs]) -> Optional[dict[int, Logprob]]:
    if entry is None:
        return None
    return {t: Logprob(lp, rank, text) for t, lp, rank, text in entry}


@dataclass
class _Sent:
    prompt_sent: bool = False
    prompt_logprobs: int = 0
    text: dict[int, int] = field(default_factory=dict)     # completion index -> chars sent
    tokens: dict[int, int] = field(default_factory=dict)   # completion index -> tokens sent
    finished: set[int] = field(default_factory=set)        # completions already sent finished


class DeltaEncoder:
    """Engine side: each RequestOutput as what is new since this request's last delta."""

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}

    def encode(self, out: RequestOutput) -> OutputDelta:
        sent = self._sent.setdefault(out.request_id, _Sent())
        completions = []
        for o in out.outputs:
            if o.index in sent.finished:
                continue  # a finished completion never changes again
            text_start = min(sent.text.get(o.index, 0), len(o.text))
            token_start = sent.tokens.get(o.index, 0)
            if (o.index in sent.tokens and text_start == len(o.text)
                    and token_start == len(o.token_ids) and o.finish_reason is None):
                continue  # nothing new for this one
            stats = o.spec_decode_stats
            completions.append(CompletionDelta(
                o.index, text_start, o.text[text_start:], token_start, o.token_ids[token_start:],
                o.cumulative_logprob,
                None if o.logprobs is None
                else [_wire_logprobs(e) for e in o.logprobs[token_start:]],
                o.finish_reason, o.stop_reason,
                None if stats is None else (stats.num_spec_steps, stats.num_draft_tokens,
                                            stats.num_accepted_tokens,
                                            list(stats.acceptance_histogram)),
                [origin == "draft" for origin in o.token_origins[token_start:]],
                list(o.rejected_draft_ids[token_start:])))
            sent.text[o.index] = len(o.text)
            sent.tokens[o.index] = len(o.token_ids)
            if o.finish_reason is not None:
                sent.finished.add(o.index)
        plp = out.prompt_logprobs
        plp_start = sent.prompt_logprobs
        delta = OutputDelta(
            out.request_id, out.finished, out.error, out.num_cached_tokens,
            None if sent.prompt_sent else list(out.prompt_token_ids), plp_start,
            None if plp is None else [_wire_logprobs(e) for e in plp[plp_start:]], completions)
        sent.prompt_sent = True
        sent.prompt_logprobs = len(plp) if plp is not None else 0
        if out.finished:
            del self._sent[out.request_id]
        return delta

    def forget(self, request_id: str) -> None:
        """An aborted request sends nothing more."""
        self._sent.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._sent)


@dataclass
class _Completion:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list[dict[int, Logprob]]] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    spec_stats: Optional[tuple[int, int, int, list[int]]] = None
    from_draft: list[bool] = field(default_factory=list)
    rejected: list[Optional[int]] = field(default_factory=list)

    def apply(self, d: CompletionDelta) -> None:
        self.text = self.text[:d.text_start] + d.text
        del self.token_ids[d.token_start:]
        self.token_ids += d.token_ids
        self.cumulative_logprob = d.cumulative_logprob
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or [])[:d.token_start]
            self.logprobs += [_logprobs(e) or {} for e in d.logprobs]
        self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason
        self.spec_stats = d.spec_stats
        del self.from_draft[d.token_start:]
        self.from_draft += d.from_draft
        del self.rejected[d.token_start:]
        self.rejected += d.rejected_draft_ids

    def snapshot(self) -> CompletionOutput:
        stats = None
        if self.spec_stats is not None:
            steps, drafted, accepted, hist = self.spec_stats
            stats = SpecDecodeRequestStats(steps, drafted, accepted, list(hist))
        return CompletionOutput(
            self.index, self.text, list(self.token_ids), self.cumulative_logprob,
            None if self.logprobs is None else list(self.logprobs), self.finish_reason,
            self.stop_reason, stats, ["draft" if d else "target" for d in self.from_draft],
            list(self.rejected))


@dataclass
class _Request:
    prompt: Optional[str]
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    completions: dict[int, _Completion] = field(default_factory=dict)


class OutputAssembler:
    """API side: deltas back into cumulative RequestOutputs, each a fresh snapshot (its lists are
    copies), so a consumer may hold one while later deltas arrive."""

    def __init__(self) -> None:
        self._requests: dict[str, _Request] = {}

    def add(self, request_id: str, prompt: Union[str, list[int]]) -> None:
        self._requests[request_id] = _Request(
            prompt if isinstance(prompt, str) else None,
            [] if isinstance(prompt, str) else list(prompt))

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def apply(self, d: OutputDelta) -> RequestOutput:
        """Raises KeyError for a request that was never added (or already forgotten)."""
        req = self._requests[d.request_id]
        if d.prompt_token_ids is not None:
            req.prompt_token_ids = d.prompt_token_ids
        if d.prompt_logprobs is not None:
            req.prompt_logprobs = (req.prompt_logprobs or [])[:d.prompt_logprobs_start]
            req.prompt_logprobs += [_logprobs(e) for e in d.prompt_logprobs]
        for c in d.completions:
            req.completions.setdefault(c.index, _Completion(c.index)).apply(c)
        if d.finished:
            del self._requests[d.request_id]
        return RequestOutput(
            d.request_id, req.prompt, req.prompt_token_ids,
            None if req.prompt_logprobs is None else list(req.prompt_logprobs),
            [c.snapshot() for c in req.completions.values()], d.finished, d.num_cached_tokens,
            d.error)
