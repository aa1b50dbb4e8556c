"""Outputs as deltas across the engine channel.

The engine's `RequestOutput`s are cumulative; sending them whole each step would cost the square
of the length. `DeltaEncoder` (engine side) sends only what is new since the last message for a
request, `OutputAssembler` (API side) rebuilds the same cumulative `RequestOutput`s. In the engine
core process the encoder reads the engine's request groups directly (`encode_group`, installed as
the engine's `output_builder`), slicing only the new tail of each list, so a step's output work
does not grow with the length of the outputs; `encode` takes a built `RequestOutput` (an engine
without `output_builder`, such as the tests' fake one). Token ids,
logprobs and token origins only grow; text grows too, except that the text visible while running
holds back a tail that may start a stop string (never shown, so never taken back): a delta still
says where its text starts, so the client never depends on that.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

import msgspec

from tandem.engine.prefix_view import PrefixView
from tandem.logprob_rows import LogprobRows
from tandem.outputs import CompletionOutput, Logprob, RequestOutput, SpecDecodeRequestStats

if TYPE_CHECKING:
    from tandem.engine.request_group import RequestGroup

# (token id, logprob, rank, decoded token) for each entry of a prompt position's logprobs
WireLogprobs = list[tuple[int, float, Optional[int], Optional[str]]]
# sample logprobs: `LogprobRows.tail_bytes` (entries a row, ids, values, ranks), the rows' own
# arrays, 16 bytes an entry; their texts are decoded again on the API side
WireRows = tuple[bytes, bytes, bytes, bytes]


class CompletionDelta(msgspec.Struct, array_like=True):
    index: int
    text_start: int            # the client keeps text[:text_start] and appends text
    text: str
    token_start: int           # where token_ids (and logprobs, origins) continue
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[WireRows]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]
    spec_stats: Optional[tuple[int, int, int, list[int]]]
    origins: list[str]         # token origins: "target", "draft", "ngram" or "suffix"
    rejected_draft_ids: list[Optional[int]]


class OutputDelta(msgspec.Struct, array_like=True):
    """One request's delta. Deltas are msgspec Structs: the channel encodes a step's deltas as
    MessagePack arrays (`core_messages.py`): encoded 3-15x and decoded 2.5-4x faster than
    pickle (benchmarks/bench_channel_codec.py)."""
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


def _wire_rows(logprobs: Sequence[dict[int, Logprob]], start: int) -> WireRows:
    if isinstance(logprobs, LogprobRows):
        return logprobs.tail_bytes(start)
    rows = LogprobRows()  # an engine that gives dicts (the tests' fake one)
    rows.append_dicts(logprobs[start:])
    return rows.tail_bytes(0)


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


def _completion_delta(sent: _Sent, index: int, text: str, token_ids: list[int],
                      cumulative_logprob: Optional[float],
                      logprobs: Optional[Sequence[Optional[dict[int, Logprob]]]],
                      finish_reason: Optional[str], stop_reason: Union[int, str, None],
                      stats: Optional[SpecDecodeRequestStats],
                      origins: Callable[[int], list[str]],
                      rejected: list[Optional[int]]) -> Optional[CompletionDelta]:
    """What is new in one completion since `sent` (None: nothing); the lists are the
    completion's whole lists, of which only the tail is read (a slice: one copy of the new)."""
    if index in sent.finished:
        return None  # a finished completion never changes again
    text_start = min(sent.text.get(index, 0), len(text))
    token_start = sent.tokens.get(index, 0)
    if (index in sent.tokens and text_start == len(text) and token_start == len(token_ids)
            and finish_reason is None):
        return None  # nothing new for this one
    delta = CompletionDelta(
        index, text_start, text[text_start:], token_start, token_ids[token_start:],
        cumulative_logprob,
        None if logprobs is None else _wire_rows(logprobs, token_start),
        finish_reason, stop_reason,
        None if stats is None else (stats.num_spec_steps, stats.num_draft_tokens,
                                    stats.num_accepted_tokens, list(stats.acceptance_histogram)),
        origins(token_start), rejected[token_start:])
    sent.text[index] = len(text)
    sent.tokens[index] = len(token_ids)
    if finish_reason is not None:
        sent.finished.add(index)
    return delta


class DeltaEncoder:
    """Engine side: each request's output as what is new since this request's last delta."""

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}

    def encode(self, out: RequestOutput) -> OutputDelta:
        """From a built (cumulative) RequestOutput."""
        sent = self._sent.setdefault(out.request_id, _Sent())
        completions = []
        for o in out.outputs:
            origins = o.token_origins
            c = _completion_delta(
                sent, o.index, o.text, o.token_ids, o.cumulative_logprob, o.logprobs,
                o.finish_reason, o.stop_reason, o.spec_decode_stats,
                lambda start, origins=origins: origins[start:],
                o.rejected_draft_ids)
            if c is not None:
                completions.append(c)
        return self._finish(sent, out.request_id, out.finished, out.error, out.num_cached_tokens,
                            out.prompt_token_ids, out.prompt_logprobs, completions)

    def encode_group(self, group: RequestGroup) -> OutputDelta:
        """From the engine's own request group (what `RequestGroup.make_output` reads), reading
        only the new tail of each child's lists."""
        sent = self._sent.setdefault(group.request_id, _Sent())
        completions = []
        for child in group.children:
            want_lp = child.params.logprobs is not None
            origins = child.token_origins
            c = _completion_delta(
                sent, child.index,
                group.detoks[child.request_id].visible_text(child.status.finished),
                child.output_token_ids, child.cumulative_logprob if want_lp else None,
                child.logprobs if want_lp else None, child.finish_reason, child.stop_reason,
                child.spec_stats, lambda start, origins=origins: origins[start:],
                child.rejected_drafts)
            if c is not None:
                completions.append(c)
        first = group.children[0] if group.children else None
        want_plp = first is not None and first.params.prompt_logprobs is not None
        return self._finish(sent, group.request_id, group.finished, group.error,
                            first.num_cached_tokens if first else 0, group.prompt_token_ids,
                            first.prompt_logprobs if want_plp and first else None, completions)

    def _finish(self, sent: _Sent, request_id: str, finished: bool, error: Optional[str],
                num_cached_tokens: int, prompt_token_ids: Sequence[int],
                plp: Optional[Sequence[Optional[dict[int, Logprob]]]],
                completions: list[CompletionDelta]) -> OutputDelta:
        plp_start = sent.prompt_logprobs
        delta = OutputDelta(
            request_id, finished, error, num_cached_tokens,
            None if sent.prompt_sent else list(prompt_token_ids), plp_start,
            None if plp is None else [_wire_logprobs(e) for e in plp[plp_start:]], completions)
        sent.prompt_sent = True
        sent.prompt_logprobs = len(plp) if plp is not None else 0
        if finished:
            del self._sent[request_id]
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
    logprobs: Optional[LogprobRows] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    spec_stats: Optional[tuple[int, int, int, list[int]]] = None
    origins: list[str] = field(default_factory=list)  # as outputs give them
    rejected: list[Optional[int]] = field(default_factory=list)

    def apply(self, d: CompletionDelta, texts: Optional[Callable[[int], str]]) -> None:
        self.text = self.text[:d.text_start] + d.text
        self.token_ids = _extend(self.token_ids, d.token_start, d.token_ids)
        self.cumulative_logprob = d.cumulative_logprob
        if d.logprobs is not None:
            rows = self.logprobs if self.logprobs is not None else LogprobRows(texts)
            if d.token_start < len(rows):
                rows = rows.prefix(d.token_start)  # views taken earlier keep what they saw
            rows.append_bytes(*d.logprobs)
            self.logprobs = rows
        self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason
        self.spec_stats = d.spec_stats
        self.origins = _extend(self.origins, d.token_start, d.origins)  # once per token
        self.rejected = _extend(self.rejected, d.token_start, d.rejected_draft_ids)

    def snapshot(self, final: bool) -> CompletionOutput:
        """The lists as views of what they hold now (O(1)); a final output, after which nothing
        is applied, takes the lists themselves."""
        stats = None
        if self.spec_stats is not None:
            steps, drafted, accepted, hist = self.spec_stats
            stats = SpecDecodeRequestStats(steps, drafted, accepted, list(hist))
        seq = _same if final else PrefixView
        return CompletionOutput(
            self.index, self.text, seq(self.token_ids), self.cumulative_logprob,
            None if self.logprobs is None else self.logprobs if final else self.logprobs.view(),
            self.finish_reason,
            self.stop_reason, stats, seq(self.origins), seq(self.rejected))


def _extend(items: list, start: int, new: list) -> list:
    """`items[:start] + new`, appending in place: the lists only grow, so views taken earlier
    stay true; a delta that starts earlier (never sent today) gets a new list instead."""
    if start < len(items):
        items = items[:start]
    items += new
    return items


def _same(items: list) -> list:
    return items


@dataclass
class _Request:
    prompt: Optional[str]
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    completions: dict[int, _Completion] = field(default_factory=dict)


class OutputAssembler:
    """API side: deltas back into cumulative RequestOutputs. A consumer may hold one while later
    deltas arrive: its lists are `PrefixView`s of what they held when it was built. `texts`
    gives the sample logprobs' decoded tokens (`TokenTexts` of the API's tokenizer)."""

    def __init__(self, texts: Optional[Callable[[int], str]] = None) -> None:
        self._requests: dict[str, _Request] = {}
        self._texts = texts

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
        return self.apply_lazily(d)()

    def apply_lazily(self, d: OutputDelta) -> Callable[[], RequestOutput]:
        """Apply the delta now; the snapshot is built when the returned function is called (a
        reader that lags takes only the newest, so the others are never built)."""
        req = self._requests[d.request_id]
        if d.prompt_token_ids is not None:
            req.prompt_token_ids = d.prompt_token_ids
        if d.prompt_logprobs is not None:
            req.prompt_logprobs = _extend(req.prompt_logprobs or [], d.prompt_logprobs_start,
                                          [_logprobs(e) for e in d.prompt_logprobs])
        for c in d.completions:
            req.completions.setdefault(c.index, _Completion(c.index)).apply(c, self._texts)
        if d.finished:
            del self._requests[d.request_id]
        return functools.partial(_snapshot, d, req)


def _snapshot(d: OutputDelta, req: _Request) -> RequestOutput:
    plp = req.prompt_logprobs
    return RequestOutput(
        d.request_id, req.prompt, req.prompt_token_ids,
        None if plp is None else plp if d.finished else PrefixView(plp),
        [c.snapshot(d.finished) for c in req.completions.values()], d.finished,
        d.num_cached_tokens, d.error)
