"""AsyncLLMEngine over the fake engine: delivery, errors from add_request, aborts, step failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from entrypoints.fake_engine import FakeEngine
from tandem.engine.async_engine import AsyncLLMEngine, EngineStepError
from tandem.sampling_params import SamplingParams


@pytest.fixture()
def engines(tokenizer: Any):
    fake = FakeEngine(tokenizer, max_model_len=64)
    engine = AsyncLLMEngine(fake)
    yield fake, engine
    engine.shutdown()


def test_generate_yields_until_finished(engines) -> None:
    fake, engine = engines

    async def run() -> list:
        return [out async for out in engine.generate("Hello", SamplingParams(
            temperature=0, max_tokens=5), "r1")]

    outs = asyncio.run(run())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 5
    assert all(not o.finished for o in outs[:-1])
    assert fake.free_blocks == fake.num_blocks and engine.num_in_flight == 0


def test_add_request_errors_reach_the_caller(engines) -> None:
    _, engine = engines

    async def run() -> None:
        async for _ in engine.generate([10**6], SamplingParams(), "bad"):
            pass

    with pytest.raises(ValueError, match="out of vocabulary"):
        asyncio.run(run())


def test_leaving_early_aborts_and_frees_blocks(engines) -> None:
    fake, engine = engines

    async def run() -> int:
        gen = engine.generate("Hello", SamplingParams(max_tokens=50, ignore_eos=True), "r2")
        async for _ in gen:
            break
        await gen.aclose()
        await engine.call(lambda e: None)  # the abort is applied before this returns
        return await engine.num_free_kv_blocks()

    assert asyncio.run(run()) == fake.num_blocks
    assert not fake.requests


def test_step_failure_fails_in_flight_requests_and_loop_survives(engines) -> None:
    fake, engine = engines

    async def failing() -> None:
        fake.fail_next_step = True
        async for _ in engine.generate("Hello", SamplingParams(max_tokens=5), "r3"):
            pass

    with pytest.raises(EngineStepError, match="injected"):
        asyncio.run(failing())

    async def ok() -> int:
        outs = [o async for o in engine.generate("Hello", SamplingParams(max_tokens=3), "r4")]
        return len(outs[-1].outputs[0].token_ids)

    assert asyncio.run(ok()) == 3 and engine.is_running
