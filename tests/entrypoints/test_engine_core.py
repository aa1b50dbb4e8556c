"""EngineCoreClient against an EngineCore over a real socketpair, the core's loop on a thread over
the fake engine (the process itself is tested over HTTP in test_engine_process.py): the same
outputs as the in-thread engine, errors from admission, aborts, a failing step, utility calls,
a core that dies, goes away or falls silent, and readers that lag or stall."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Iterator

import pytest

from entrypoints.fake_engine import FakeEngine
from tandem.engine.async_engine import AsyncLLMEngine
from tandem.engine.core_client import EngineCoreClient
from tandem.engine.core_messages import Ready
from tandem.engine.core_process import EngineCore
from tandem.engine.engine_client import EngineDeadError, EngineStepError, ReaderStalledError
from tandem.sample.structured_params import StructuredOutputsParams
from tandem.sampling_params import SamplingParams


class _Pair:
    def __init__(self, tokenizer: Any, grammars: Any = None, **client_kwargs: Any) -> None:
        self.fake = FakeEngine(tokenizer, max_model_len=64, spec_k=2)
        if grammars is not None:  # the fake then compiles in add_request, as LLMEngine does
            self.fake.grammars = grammars
            add = self.fake.add_request

            def add_compiling(request_id: str, prompt: Any, params: SamplingParams,
                              final_only: bool = False) -> None:
                if params.structured_outputs is not None:
                    grammars.prototype(params.structured_outputs)
                add(request_id, prompt, params, final_only)

            self.fake.add_request = add_compiling
        ours, theirs = socket.socketpair()
        self.core = EngineCore(self.fake, theirs)
        self.exit_code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.exit_code.append(self.core.run()),
                                       daemon=True)
        self.thread.start()
        self.client = EngineCoreClient(ours, Ready(self.fake.num_blocks, []), tokenizer, 64,
                                       self.fake.vocab_size, {}, **client_kwargs)
        self.dead_calls: list[bool] = []
        self.client.on_dead = lambda: self.dead_calls.append(True)


@pytest.fixture()
def pair(tokenizer: Any) -> Iterator[_Pair]:
    p = _Pair(tokenizer)
    yield p
    p.client.shutdown()
    p.thread.join(5)


async def _collect(client: Any, prompt: Any, params: SamplingParams, rid: str) -> list:
    return [out async for out in client.generate(prompt, params, rid)]


PARAMS = SamplingParams(temperature=0, max_tokens=6, logprobs=2, n=2, stop=["zz"])


def test_outputs_equal_the_in_thread_engines(pair: _Pair, tokenizer: Any) -> None:
    async def over_channel() -> list:
        await pair.client.start()
        return await _collect(pair.client, [5, 6, 7], PARAMS, "r1")

    outs = asyncio.run(over_channel())
    local = AsyncLLMEngine(FakeEngine(tokenizer, max_model_len=64, spec_k=2))
    try:
        expected = asyncio.run(_collect(local, [5, 6, 7], PARAMS, "r1"))
    finally:
        local.shutdown()
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert outs[-1] == expected[-1]  # text, ids, logprobs, spec stats: all of it
    assert pair.client.num_in_flight == 0 and pair.fake.free_blocks == pair.fake.num_blocks
    assert pair.client.metrics_snapshot()  # published with the finished request


def test_admission_errors_reach_the_caller_and_the_loop_goes_on(pair: _Pair) -> None:
    async def run() -> list:
        await pair.client.start()
        with pytest.raises(ValueError, match="out of vocabulary"):
            await pair.client.add_request("bad", [10**6], SamplingParams())
        return await _collect(pair.client, [5, 6], SamplingParams(max_tokens=3), "good")

    assert asyncio.run(run())[-1].finished
    assert pair.client.num_in_flight == 0


def test_leaving_a_stream_aborts_its_request(pair: _Pair) -> None:
    pair.fake.step_delay = 0.02

    async def run() -> tuple[int, int]:
        await pair.client.start()
        async for _ in pair.client.generate([5, 6], SamplingParams(max_tokens=50,
                                                                   ignore_eos=True), "r"):
            break
        await asyncio.sleep(0.2)  # the abort crosses the channel, a step at most
        return await pair.client.num_free_kv_blocks(), pair.client.num_in_flight

    free, in_flight = asyncio.run(run())
    assert free == pair.fake.num_blocks and in_flight == 0 and not pair.fake.requests


def test_a_failing_step_fails_its_requests_and_the_next_ones_run(pair: _Pair) -> None:
    async def run() -> list:
        await pair.client.start()
        stream = await pair.client.add_request("r", [5, 6], SamplingParams(max_tokens=40))
        pair.fake.fail_next_step = True
        with pytest.raises(EngineStepError, match="injected step failure"):
            async for _ in pair.client.iterate("r", stream):
                pass
        return await _collect(pair.client, [5, 6], SamplingParams(max_tokens=3), "next")

    assert asyncio.run(run())[-1].finished and pair.client.is_running


def test_utility_calls_read_the_engine_between_steps(pair: _Pair) -> None:
    async def run() -> tuple[Any, Any]:
        await pair.client.start()
        return await pair.client.get_metrics(), await pair.client.num_free_kv_blocks()

    metrics, free = asyncio.run(run())
    assert free == pair.fake.num_blocks
    names = {m.name for m in metrics}
    assert "tandem:kv_cache_free_blocks" in names
    assert "vllm:spec_decode_num_accepted_tokens" in names  # with vLLM's names added


def test_a_dying_core_fails_requests_in_flight_and_calls_on_dead(pair: _Pair) -> None:
    def step() -> Any:
        raise SystemExit("the loop dies")  # not an Exception: escapes the step guard

    async def run() -> None:
        await pair.client.start()
        pair.fake.step = step
        with pytest.raises(EngineDeadError, match="the loop dies"):
            await _collect(pair.client, [5, 6], SamplingParams(max_tokens=3), "r")
        with pytest.raises(EngineDeadError):
            await pair.client.add_request("after", [5], SamplingParams())

    asyncio.run(run())
    pair.thread.join(5)
    assert pair.exit_code == [1] and pair.dead_calls == [True]
    assert not pair.client.is_running and not pair.client.accepting


def test_a_closed_channel_is_a_dead_engine(pair: _Pair) -> None:
    pair.fake.step_delay = 0.02

    async def run() -> None:
        await pair.client.start()
        stream = await pair.client.add_request("r", [5, 6], SamplingParams(
            max_tokens=500, ignore_eos=True))
        pair.core.sock.shutdown(socket.SHUT_RDWR)  # as when the process is killed
        with pytest.raises(EngineDeadError, match="exited"):
            async for _ in pair.client.iterate("r", stream):
                pass

    asyncio.run(run())
    assert pair.dead_calls == [True] and not pair.client.is_running


class _SlowGrammars:
    """A grammar compiler that takes its time on first use (as llguidance does), then caches."""

    def __init__(self) -> None:
        self.cache: dict[str, object] = {}

    def prototype(self, spec: StructuredOutputsParams) -> object:
        if spec.key() in self.cache:
            return self.cache[spec.key()]
        time.sleep(0.4)
        if spec.choice == ["bad"]:
            raise ValueError("structured_outputs.choice cannot be compiled: bad")
        return self.cache.setdefault(spec.key(), object())


def test_a_grammar_compiles_off_the_loop_while_others_stream(tokenizer: Any) -> None:
    pair = _Pair(tokenizer, grammars=_SlowGrammars())
    pair.fake.step_delay = 0.01

    async def run() -> tuple[int, bool]:
        await pair.client.start()
        stream = await pair.client.add_request("plain", [5, 6], SamplingParams(
            max_tokens=60, ignore_eos=True))
        seen = 0

        async def read() -> None:
            nonlocal seen
            async for _ in pair.client.iterate("plain", stream):
                seen += 1

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.05)
        before = seen
        structured = SamplingParams(max_tokens=3, structured_outputs=StructuredOutputsParams(
            choice=["yes", "no"]))
        outs = await _collect(pair.client, [5, 6], structured, "structured")  # waits 0.4 s
        during = seen - before
        with pytest.raises(ValueError, match="cannot be compiled"):
            await pair.client.add_request("bad", [5], SamplingParams(
                structured_outputs=StructuredOutputsParams(choice=["bad"])))
        await reader
        return during, outs[-1].finished

    try:
        during, finished = asyncio.run(run())
    finally:
        pair.client.shutdown()
        pair.thread.join(5)
    assert finished
    assert during >= 5, during  # the plain stream kept going while the grammar compiled


# ---- the watchdog and the collectors -------------------------------------------------------------

def test_a_lagging_reader_takes_the_newest_output_and_nothing_else_is_built(
        tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem.engine import output_deltas
    built: list[int] = []
    snapshot = output_deltas._snapshot

    def counting(d: Any, req: Any) -> Any:
        built.append(1)
        return snapshot(d, req)

    monkeypatch.setattr(output_deltas, "_snapshot", counting)
    pair = _Pair(tokenizer)

    async def run() -> None:
        await pair.client.start()
        stream = await pair.client.add_request("r", [5, 6], SamplingParams(
            max_tokens=40, ignore_eos=True))
        while pair.fake.has_unfinished_requests() or stream.empty():
            await asyncio.sleep(0.01)  # the reader sleeps while all 40 steps arrive
        outs = [out async for out in pair.client.iterate("r", stream)]
        assert len(outs) == 1 and outs[0].finished
        assert len(outs[0].outputs[0].token_ids) == 40

    try:
        asyncio.run(run())
    finally:
        pair.client.shutdown()
        pair.thread.join(5)
    assert len(built) == 1  # 40 deltas arrived; one snapshot was made, for the one reader


def test_a_stalled_reader_is_aborted_and_its_blocks_freed(tokenizer: Any) -> None:
    pair = _Pair(tokenizer, stream_stall_timeout_s=0.3)
    pair.fake.step_delay = 0.01
    free = pair.fake.free_blocks

    async def run() -> None:
        await pair.client.start()
        stream = await pair.client.add_request("stalled", [5, 6], SamplingParams(
            max_tokens=100000, ignore_eos=True))
        live = await pair.client.add_request("reading", [5, 6], SamplingParams(
            max_tokens=60, ignore_eos=True))
        outs = [out async for out in pair.client.iterate("reading", live)]  # ~0.6 s of steps
        assert outs[-1].finished
        await asyncio.sleep(0.5)
        with pytest.raises(ReaderStalledError, match="read nothing"):
            async for _ in pair.client.iterate("stalled", stream):
                pass
        deadline = time.monotonic() + 5
        while pair.fake.has_unfinished_requests():
            assert time.monotonic() < deadline, "the stalled request was not aborted"
            await asyncio.sleep(0.01)

    try:
        asyncio.run(run())
    finally:
        pair.client.shutdown()
        pair.thread.join(5)
    assert pair.fake.free_blocks == free  # the aborted request gave its blocks back


def test_a_silent_core_is_hung_within_the_limit(tokenizer: Any) -> None:
    pair = _Pair(tokenizer, iteration_timeout_s=0.5)
    release = threading.Event()
    step = pair.fake.step

    def hanging_step() -> Any:
        if pair.fake.steps >= 5:
            release.wait(30)  # a deadlocked kernel: the step never ends
        return step()

    pair.fake.step = hanging_step

    async def run() -> float:
        await pair.client.start()
        await asyncio.sleep(1.5)  # idle: the heartbeat keeps it alive past the limit
        assert pair.client.is_running and not pair.dead_calls
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="sent nothing"):
            await _collect(pair.client, [5, 6], SamplingParams(max_tokens=50,
                                                               ignore_eos=True), "r")
        return time.monotonic() - t0

    try:
        waited = asyncio.run(run())
    finally:
        release.set()
        pair.client.shutdown()
        pair.thread.join(5)
    assert 3.0 <= waited < 3.0 + 1.0, waited  # the floor: three idle heartbeats
    assert pair.dead_calls == [True] and not pair.client.accepting


def test_the_silence_limit_grows_with_the_longest_step() -> None:
    from tandem.engine.core_watchdog import CoreWatchdog
    dog = CoreWatchdog(iteration_timeout_s=5.0, stream_stall_timeout_s=300.0)
    dog.heard(busy=False, now=0.0)
    dog.heard(busy=False, now=30.0)  # an idle gap is not a step
    assert dog.silence_limit_s == 5.0 and dog.hung(now=34.0) is None
    assert "sent nothing for 6 s" in (dog.hung(now=36.0) or "")
    dog.heard(busy=True, now=33.0)   # the first output of a request: the wait was idle
    assert dog.silence_limit_s == 5.0
    dog.heard(busy=True, now=40.0)   # a 7 s step
    assert dog.silence_limit_s == 28.0
    assert dog.hung(now=40.0 + 27.0) is None and dog.hung(now=40.0 + 29.0) is not None
