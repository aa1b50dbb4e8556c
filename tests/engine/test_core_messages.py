"""The engine core channel's messages in isolation: frames, requests, output deltas rebuilt into
the engine's cumulative outputs, aborts, errors and metrics snapshots."""

from __future__ import annotations

import copy
import tracemalloc

import pytest

from tandem.engine.core_messages import (AbortRequests, AddRequest, AddResult,
                                         EngineCoreOutputs, FrameBuffer, Ready, Shutdown,
                                         StartupFailed, UtilityCall, UtilityResult, encode_frame)
from tandem.engine.output_deltas import DeltaEncoder, OutputAssembler, OutputDelta
from tandem.engine.prefix_view import PrefixView
from tandem.logprob_rows import LogprobRows, TokenTexts
from tandem.metrics import Histogram, Metric, Vector
from tandem.outputs import CompletionOutput, Logprob, RequestOutput, SpecDecodeRequestStats
from tandem.sampling_params import SamplingParams


def _roundtrip(message: object) -> object:
    (out,) = FrameBuffer().feed(encode_frame(message))
    return out


def _across(delta: OutputDelta) -> OutputDelta:
    """A delta through the channel as the engine core sends it (MessagePack inside the frame)."""
    (out,) = _roundtrip(EngineCoreOutputs(outputs=[delta])).outputs
    return out


def test_frames_survive_any_split_and_arrive_in_order() -> None:
    messages = [AddRequest("r1", [1, 2, 3], SamplingParams(temperature=0, max_tokens=4)),
                AbortRequests(["r1", "r2"]), UtilityCall(7, "get_metrics"), Shutdown(),
                AddRequest("r2", "a text prompt ✓", SamplingParams(seed=3, stop=["\n"]))]
    data = b"".join(encode_frame(m) for m in messages)
    for chunk in (1, 3, 7, len(data)):
        buf = FrameBuffer()
        got = []
        for i in range(0, len(data), chunk):
            got += buf.feed(data[i:i + chunk])
        assert got == messages and buf.pending_bytes == 0
    partial = FrameBuffer()
    assert partial.feed(data[:5]) == [] and partial.pending_bytes == 5


def test_a_turn_of_deltas_alone_travels_without_pickle() -> None:
    delta = OutputDelta("r1", False, None, 0, None, 0, None, [])
    plain = encode_frame(EngineCoreOutputs(outputs=[delta, delta]))
    assert plain[3] & 0x80 and b"\x80\x05" not in plain[:6]  # the flag, then no pickle header
    with_metrics = EngineCoreOutputs(outputs=[delta], metrics=[Metric("m", 1.0)])
    mixed = [EngineCoreOutputs(), EngineCoreOutputs(outputs=[delta, delta]), with_metrics,
             EngineCoreOutputs(added=[AddResult("r2")], outputs=[delta]),
             EngineCoreOutputs(dead="gone")]
    frames = [encode_frame(m) for m in mixed]
    assert [bool(f[3] & 0x80) for f in frames] == [True, True, False, False, False]
    data = b"".join(frames)
    for chunk in (1, 5, len(data)):
        buf = FrameBuffer()
        got = []
        for i in range(0, len(data), chunk):
            got += buf.feed(data[i:i + chunk])
        assert got == mixed and buf.pending_bytes == 0


def test_request_messages_keep_every_field() -> None:
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, seed=11, stop=["x"], logprobs=2,
                            max_tokens=9, stop_token_ids=[5])
    add = _roundtrip(AddRequest("req-1", [4, 5, 6], params))
    assert add == AddRequest("req-1", [4, 5, 6], params) and add.params.seed == 11
    assert _roundtrip(AbortRequests(["a", "b"])).request_ids == ["a", "b"]
    assert isinstance(_roundtrip(Shutdown()), Shutdown)


def test_a_utility_call_names_an_allowed_method() -> None:
    assert _roundtrip(UtilityCall(1, "num_free_kv_blocks")).method == "num_free_kv_blocks"
    with pytest.raises(ValueError, match="UtilityCall.method must be one of"):
        UtilityCall(2, "shutdown")


def test_outputs_errors_and_metrics_snapshots_roundtrip() -> None:
    metrics = [Metric("tandem:request_success", 3),
               Vector("tandem:request_success_by_reason", {"stop": 2.0}, "reason"),
               Histogram("tandem:time_to_first_token_seconds", [0.1, 1.0], [1, 2], 0.3)]
    out = EngineCoreOutputs(added=[AddResult("a"), AddResult("b", "ValueError", "too long")],
                            outputs=[OutputDelta("a", True, "RuntimeError: boom", 0, None, 0,
                                                 None, [])],
                            metrics=metrics, utility=[UtilityResult(3, 17),
                                                      UtilityResult(4, error="KeyError: x")])
    back = _roundtrip(out)
    assert back == out and back.metrics == metrics
    assert _roundtrip(EngineCoreOutputs(dead="WorkerDiedError: rank 1")).dead.endswith("rank 1")
    assert not EngineCoreOutputs() and EngineCoreOutputs(metrics=[])
    assert _roundtrip(Ready(24, metrics)) == Ready(24, metrics)
    assert _roundtrip(StartupFailed("no such model")).message == "no such model"


def _text(token: int) -> str:
    """The tests' tokenizer: a sample logprob's text is decoded again on the API side."""
    return f"t{token}"


def _lp(token: int, value: float) -> dict[int, Logprob]:
    return {token: Logprob(value, 1, _text(token)), 99: Logprob(-9.0, 2, _text(99))}


def _snapshots() -> list[RequestOutput]:
    """Cumulative outputs of one request (n = 2) as the engine makes them: text held back then
    released, a stop string cutting the text at the end, logprobs, origins and spec stats."""
    stats = SpecDecodeRequestStats()
    outs = []
    toks0: list[int] = []
    toks1: list[int] = []
    texts0 = ["He", "Hell", "Hello wo", "Hello world"]
    for step in range(4):
        toks0.append(10 + step)
        stats.record(2, step % 3, 2)
        c0 = CompletionOutput(0, texts0[step], list(toks0), -0.5 * (step + 1),
                              [_lp(t, -0.5) for t in toks0],
                              "stop" if step == 3 else None, "!" if step == 3 else None,
                              copy.deepcopy(stats), ["draft" if t % 2 else "target" for t in toks0],
                              [None if t % 2 else t + 1 for t in toks0])
        completions = [c0]
        if step >= 1:  # the second choice is created a step later (admitted a window at a time)
            if step < 3:
                toks1.append(20 + step)
            completions.append(CompletionOutput(1, "x" * len(toks1), list(toks1),
                                                -1.0 * len(toks1), [_lp(t, -1.0) for t in toks1],
                                                "length" if step == 3 else None, None, None,
                                                ["target"] * len(toks1), [None] * len(toks1)))
        outs.append(RequestOutput("r", None, [1, 2, 3], [None, _lp(2, -0.1), _lp(3, -0.2)],
                                  completions, finished=step == 3, num_cached_tokens=16))
    return outs


def test_deltas_rebuild_the_engines_cumulative_outputs() -> None:
    encoder, assembler = DeltaEncoder(), OutputAssembler(_text)
    assembler.add("r", [1, 2, 3])
    for out in _snapshots():
        delta = _across(encoder.encode(out))
        assert assembler.apply(delta) == out
    assert "r" not in assembler and len(encoder) == 0  # a finished request is forgotten


def test_a_delta_carries_only_what_changed() -> None:
    encoder = DeltaEncoder()
    snaps = _snapshots()
    encoder.encode(snaps[0])
    d = encoder.encode(snaps[1])
    assert d.prompt_token_ids is None and d.prompt_logprobs == []
    c0 = next(c for c in d.completions if c.index == 0)
    assert (c0.token_start, c0.token_ids, c0.text_start, c0.text) == (1, [11], 2, "ll")
    assert len(c0.logprobs[0]) == 4 and c0.origins == ["draft"]  # one row: 4 bytes of its length
    unchanged = encoder.encode(snaps[1])
    assert unchanged.completions == []  # nothing new: no completion travels


def test_an_assembler_snapshot_is_not_changed_by_later_deltas() -> None:
    encoder, assembler = DeltaEncoder(), OutputAssembler(_text)
    assembler.add("r", [1, 2, 3])
    snaps = _snapshots()
    held = assembler.apply(encoder.encode(snaps[0]))
    kept = copy.deepcopy(held)
    assembler.apply(encoder.encode(snaps[1]))
    assert held == kept


def test_a_snapshot_costs_the_same_however_long_the_output() -> None:
    """A streaming reader takes a snapshot every step: copying the lists into each would cost
    O(length) a step (issue 45). Snapshots of a 50,000-token output allocate no more than those
    of a 50-token one, and only the final output carries the lists themselves."""
    def allocated(length: int) -> tuple[int, RequestOutput]:
        encoder, assembler = DeltaEncoder(), OutputAssembler(_text)
        assembler.add("r", [1])
        toks = list(range(length))
        out = RequestOutput("r", None, [1], None, [CompletionOutput(
            0, "x", toks, None, None, token_origins=["target"] * length,
            rejected_draft_ids=[None] * length)], finished=False)
        take = assembler.apply_lazily(encoder.encode(out))
        tracemalloc.start()
        held = [take() for _ in range(20)]
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size, held[-1]

    short, _ = allocated(50)
    long_, snap = allocated(50_000)
    assert long_ < 2 * short + 4096, (short, long_)  # a copy each would be 20 x 3 x 400 KB
    o = snap.outputs[0]
    assert len(o.token_ids) == 50_000 and o.token_ids[-3:] == [49_997, 49_998, 49_999]
    assert o.token_origins[49_999:] == ["target"] and not isinstance(o.token_ids, list)
    final = _snapshots()
    encoder, assembler = DeltaEncoder(), OutputAssembler(_text)
    assembler.add("r", [1, 2, 3])
    last = [assembler.apply(encoder.encode(out)) for out in final][-1]
    assert all(type(c.token_ids) is list and type(c.token_origins) is list
               and type(c.logprobs) is LogprobRows for c in last.outputs)
    assert type(last.prompt_logprobs) is list


def test_a_prefix_view_reads_as_the_list_it_was_taken_from() -> None:
    items = [1, 2, 3, 4]
    view = PrefixView(items)
    items += [5, 6]  # the owner appends after the view was taken
    assert len(view) == 4 and list(view) == [1, 2, 3, 4] and view == [1, 2, 3, 4]
    assert view[1:] == [2, 3, 4] and view[-2:] == [3, 4] and view[::-1] == [4, 3, 2, 1]
    assert view[10:] == [] and view[-1] == 4 and view != [1, 2, 3, 4, 5] and view + [9] == [
        1, 2, 3, 4, 9]
    with pytest.raises(IndexError):
        view[4]
    assert repr(view) == "[1, 2, 3, 4]" and not PrefixView([])


def test_a_text_prompt_gets_its_ids_from_the_first_delta_and_aborts_are_forgotten() -> None:
    encoder, assembler = DeltaEncoder(), OutputAssembler(_text)
    assembler.add("t", "Hi there")
    out = RequestOutput("t", "Hi there", [7, 8], None,
                        [CompletionOutput(0, "a", [5], None, None)], finished=False)
    got = assembler.apply(encoder.encode(out))
    assert got.prompt == "Hi there" and got.prompt_token_ids == [7, 8]
    encoder.forget("t")
    assembler.forget("t")
    assert len(encoder) == 0 and "t" not in assembler
    with pytest.raises(KeyError):
        assembler.apply(encoder.encode(out))


def test_deltas_read_from_the_engines_requests_equal_deltas_of_its_outputs(
        tiny_llama: str) -> None:
    """The engine core installs `encode_group` (slices of the requests' own lists) in place of
    encoding each built RequestOutput: the assembler must rebuild the same outputs, step by
    step, with speculation, logprobs, n = 2, a stop string and prompt logprobs."""
    from tandem.engine.llm_engine import LLMEngine
    engine = LLMEngine.from_kwargs(model=tiny_llama, max_model_len=128, speculative_config={
        "model": tiny_llama, "num_speculative_tokens": 3, "adaptive": False})
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=24, n=2, logprobs=2,
                            prompt_logprobs=1, stop=["e"])
    by_group, by_output = DeltaEncoder(), DeltaEncoder()
    texts = TokenTexts(engine.tokenizer)  # the API process's own copy of the tokenizer
    assemblers = {"group": OutputAssembler(texts), "output": OutputAssembler(texts)}
    for a in assemblers.values():
        a.add("r", [5, 6, 7])
    built: list[OutputDelta] = []
    engine.output_builder = lambda group: (built.append(by_group.encode_group(group)),
                                           group.make_output())[1]
    engine.add_request("r", [5, 6, 7], params)
    steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        for out in outs:
            delta = built.pop(0)
            assert _roundtrip(delta) == _roundtrip(by_output.encode(out))
            assert assemblers["group"].apply(delta) == out
        steps += 1
    assert steps > 2 and not built and len(by_group) == 0
