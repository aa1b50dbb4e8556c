"""`stream_interval` (vLLM's --stream-interval): a streamed request's output goes out at its first
token, then each time N new tokens have come, and when it finishes; its tokens and text are
those of interval 1. A request answered only at the end (the offline API) is untouched."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.engine.llm_engine import LLMEngine

PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _streamed(engine: LLMEngine, prompt: str, params: SamplingParams = PARAMS
              ) -> list[tuple[int, bool, str]]:
    """(tokens so far, finished, text) of every output one streamed request gets (its first
    choice's)."""
    engine.add_request("r", prompt, params)  # not final_only: an output per step it is due
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.append((len(out.outputs[0].token_ids), out.finished, out.outputs[0].text))
    return seen


@pytest.fixture(scope="module")
def engines(tiny_llama: str) -> dict[str, LLMEngine]:
    # drafted by itself: every draft accepted, bursts of 1 + k = 4 tokens a step
    spec = {"model": tiny_llama, "num_speculative_tokens": 3, "adaptive": False}
    return {"plain-1": LLM(tiny_llama).llm_engine,
            "plain-4": LLM(tiny_llama, stream_interval=4).llm_engine,
            "spec-1": LLM(tiny_llama, speculative_config=spec).llm_engine,
            "spec-6": LLM(tiny_llama, speculative_config=spec, stream_interval=6).llm_engine}


def test_plain_decoding_sends_the_first_token_then_every_fourth(engines, prompts) -> None:
    every = _streamed(engines["plain-1"], prompts[0])
    assert [n for n, _, _ in every] == list(range(1, 17))
    chunked = _streamed(engines["plain-4"], prompts[0])
    assert [n for n, _, _ in chunked] == [1, 5, 9, 13, 16]  # the last: when it finished
    assert [f for _, f, _ in chunked] == [False] * 4 + [True]
    assert chunked[-1] == every[-1]
    # each chunk's text is the text of interval 1 at that many tokens
    at = {n: text for n, _, text in every}
    assert all(text == at[n] for n, _, text in chunked)


def test_n_choices_in_step_come_four_tokens_a_chunk(engines, prompts) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    chunked = _streamed(engines["plain-4"], prompts[0], params)
    assert [n for n, _, _ in chunked] == [1, 5, 9, 13, 16]  # each choice's, not 4 / 3 of them


def test_speculative_bursts_wait_for_six_tokens(engines, prompts) -> None:
    for prompt in prompts[:3]:
        every = _streamed(engines["spec-1"], prompt)
        assert [n for n, _, _ in every] == [1, 5, 9, 13, 16]  # the prefill's token, then 4 a step
        chunked = _streamed(engines["spec-6"], prompt)
        # 1 at once; 5 - 1 < 6 waits, 9 - 1 goes; 13 - 9 < 6 waits; 16 ends the request
        assert [n for n, _, _ in chunked] == [1, 9, 16]
        at = {n: text for n, _, text in every}
        assert all(text == at[n] for n, _, text in chunked)
        assert chunked[-1] == every[-1]


def test_offline_generate_is_unchanged(tiny_llama, prompts) -> None:
    llm = LLM(tiny_llama, stream_interval=5)
    outs = llm.generate(prompts[:2], PARAMS, use_tqdm=False)
    ref = LLM(tiny_llama).generate(prompts[:2], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_stream_interval_names_the_field(tiny_llama, bad) -> None:
    with pytest.raises(ValueError, match=r"stream_interval must be an integer of at least 1 "
                                         rf"\(tokens per streamed chunk\), got {bad!r}"):
        LLM(tiny_llama, stream_interval=bad)
