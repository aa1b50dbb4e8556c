"""/v1/completions against a real `tandem serve` with the real openai client, without and with
speculative decoding (conformance checklist items 1-25; `srv` runs each test on both servers)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from entrypoints.server_helpers import API_KEY, EOS_PROMPT, ServerProcess, client_for

PROMPT = "The future of AI is"
GREEDY = dict(temperature=0, max_tokens=5)


def test_issue_client_snippet_verbatim(srv: ServerProcess) -> None:
    from openai import OpenAI
    client = OpenAI(api_key="EMPTY", base_url=srv.base_url)
    model = client.models.list().data[0].id
    completion = client.completions.create(model=model, prompt="The future of AI is", echo=False,
                                           n=1, stream=False)
    assert completion.choices[0].text and model == srv.model
    completion = client.completions.create(model=model, prompt="The future of AI is", echo=False,
                                           n=1, stream=True)
    chunks = list(completion)
    assert "".join(c.choices[0].text for c in chunks) and chunks[-1].choices[0].finish_reason


def test_shape_and_usage(oa: openai.OpenAI, srv: ServerProcess, tokenizer: Any) -> None:
    c = oa.completions.create(model=srv.model, prompt=PROMPT, **GREEDY)      # 1, 2
    assert c.id and c.object == "text_completion" and isinstance(c.created, int)
    assert len(c.choices) == 1 and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 5
    assert c.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids)
    assert c.usage.total_tokens == c.usage.prompt_tokens + 5
    assert "speculative_decoding" in c.model_extra["metrics"]
    assert c.choices[0].logprobs is None                                     # 5


def test_prompt_forms_and_batches(oa: openai.OpenAI, srv: ServerProcess, tokenizer: Any) -> None:
    ids = tokenizer(PROMPT).input_ids
    texts = {oa.completions.create(model=srv.model, prompt=p, **GREEDY).choices[0].text
             for p in (PROMPT, ids, [PROMPT], [ids])}                          # 3
    assert len(texts) == 1
    batch = oa.completions.create(model=srv.model, prompt=[PROMPT, "Hello", PROMPT], **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert batch.choices[0].text == batch.choices[2].text == texts.pop()
    batch = oa.completions.create(model=srv.model, prompt=[PROMPT, "Hello"], n=2, **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]                  # 4: prompt-major
    assert batch.choices[0].text == batch.choices[1].text != batch.choices[2].text


@pytest.mark.parametrize("k", [0, 5])
def test_logprobs_counts(oa: openai.OpenAI, srv: ServerProcess, k: int) -> None:
    lp = oa.completions.create(model=srv.model, prompt=PROMPT, logprobs=k, **GREEDY) \
        .choices[0].logprobs                                                 # 6, 7
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for top in lp.top_logprobs:
        assert (len(top) == 1) if k == 0 else (k <= len(top) <= k + 1)
    assert all(-9999.0 <= v <= 0 for v in lp.token_logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_over_max_is_400_and_server_continues(oa: openai.OpenAI, srv: ServerProcess,
                                                       stream: bool) -> None:
    for bad in (21, 30):                                                     # 8
        with pytest.raises(openai.BadRequestError):
            oa.completions.create(model=srv.model, prompt=PROMPT, logprobs=bad, stream=stream,
                                  **GREEDY)
    assert oa.completions.create(model=srv.model, prompt=PROMPT, **GREEDY) \
        .usage.completion_tokens == 5


def test_echo(oa: openai.OpenAI, srv: ServerProcess, tokenizer: Any) -> None:
    c = oa.completions.create(model=srv.model, prompt=PROMPT, echo=True, **GREEDY)  # 9
    assert c.choices[0].text.startswith(PROMPT)
    ids = tokenizer(PROMPT).input_ids
    c = oa.completions.create(model=srv.model, prompt=ids, echo=True, **GREEDY)
    assert c.choices[0].text.startswith(tokenizer.decode(ids))
    for k in (1, 3):                                                          # 10
        lp = oa.completions.create(model=srv.model, prompt=PROMPT, echo=True, logprobs=k,
                                   **GREEDY).choices[0].logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) \
            == len(lp.text_offset) == len(ids) + 5
        assert all(max(k, 1) <= len(t) <= k + 1 for t in lp.top_logprobs[1:])
    # 11: lm-eval's loglikelihood request
    c = oa.completions.create(model=srv.model, prompt=[ids], echo=True, logprobs=1,
                              max_tokens=1, temperature=0, seed=1234)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(ids) + 1
    greedy_token = max(lp.top_logprobs[-1].items(), key=lambda kv: kv[1])[0]
    assert greedy_token == lp.tokens[-1]


def _stop_from(text: str) -> str:
    """A 2-character piece of the greedy text to use as a stop string (after its start)."""
    for i in range(2, len(text) - 2):
        piece = text[i:i + 2]
        if "\ufffd" not in piece and piece.strip():
            return piece
    pytest.skip("greedy text has no clean piece to stop on")


def test_stop_string_and_offsets(oa: openai.OpenAI, srv: ServerProcess) -> None:
    full = oa.completions.create(model=srv.model, prompt=PROMPT, temperature=0, max_tokens=20,
                                 extra_body={"ignore_eos": True}).choices[0].text
    stop = _stop_from(full)
    kwargs = dict(model=srv.model, prompt=PROMPT, temperature=0, max_tokens=20, stop=[stop],
                  logprobs=1)
    c = oa.completions.create(**kwargs).choices[0]                           # 15, 55
    assert c.finish_reason == "stop" and stop not in c.text
    assert c.text == full[:full.index(stop)]
    offsets = c.logprobs.text_offset                                         # 12
    assert offsets == sorted(offsets)
    streamed = [ch.choices[0] for ch in oa.completions.create(stream=True, **kwargs)]
    assert "".join(ch.text for ch in streamed) == c.text
    assert [o for ch in streamed for o in ch.logprobs.text_offset] == offsets


def test_seeded_sampling(oa: openai.OpenAI, srv: ServerProcess) -> None:
    kwargs = dict(model=srv.model, prompt=PROMPT, temperature=1.0, max_tokens=50, seed=42)
    c = oa.completions.create(n=3, **kwargs)                                   # 13
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    assert all(ch.finish_reason for ch in c.choices)
    assert len({ch.text for ch in c.choices}) == 3
    assert len({len(ch.text) for ch in c.choices}) >= 2
    one = oa.completions.create(**{**kwargs, "max_tokens": 10}).choices[0].text   # 14
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        seeds = [42, 7, 42, 9]
        batched = list(pool.map(lambda s: oa.completions.create(
            **{**kwargs, "max_tokens": 10, "seed": s}).choices[0].text, seeds))
    assert batched[0] == batched[2] == one


def test_streaming_matches_and_finishes_once(oa: openai.OpenAI, srv: ServerProcess) -> None:
    kwargs = dict(model=srv.model, prompt=PROMPT, temperature=0, max_tokens=8)
    full = oa.completions.create(**kwargs).choices[0].text
    chunks = list(oa.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == full              # 17
    finishes = [i for i, c in enumerate(chunks) if c.choices[0].finish_reason]
    assert finishes == [len(chunks) - 1]                                     # 18
    assert all(c.usage is None for c in chunks)                              # 21
    chunks = list(oa.completions.create(stream=True, stream_options={}, **kwargs))
    assert all(c.usage is None for c in chunks)


def test_stream_include_usage_and_done(oa: openai.OpenAI, srv: ServerProcess) -> None:
    chunks = list(oa.completions.create(model=srv.model, prompt=PROMPT, stream=True,
                                        stream_options={"include_usage": True}, **GREEDY))
    assert all(c.usage is None for c in chunks[:-1])                          # 20
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + 5
    assert "speculative_decoding" in last.model_extra["metrics"]
    r = httpx.post(srv.base_url + "/completions", json={"model": srv.model, "prompt": PROMPT,
                                                         "stream": True, **GREEDY})
    assert r.text.endswith("data: [DONE]\n\n")                               # 19
    with pytest.raises(openai.BadRequestError):                               # 22
        oa.completions.create(model=srv.model, prompt=PROMPT, stream=False,
                              stream_options={"include_usage": True}, **GREEDY)


def test_stream_batches_n_and_echo(oa: openai.OpenAI, srv: ServerProcess) -> None:
    chunks = list(oa.completions.create(model=srv.model, prompt=[PROMPT, "Hello"], stream=True,
                                        **GREEDY))
    assert all(len(c.choices) == 1 for c in chunks)                          # 23
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i)
             for i in (0, 1)}
    assert texts[0] == oa.completions.create(model=srv.model, prompt=PROMPT, **GREEDY) \
        .choices[0].text
    chunks = list(oa.completions.create(model=srv.model, prompt=PROMPT, stream=True, n=3,
                                        temperature=1.0, max_tokens=5, seed=3))
    for i in range(3):                                                        # 24
        mine = [c for c in chunks if c.choices[0].index == i]
        assert sum(1 for c in mine if c.choices[0].finish_reason) == 1
        assert 1 <= len(mine) <= 5
    chunks = list(oa.completions.create(model=srv.model, prompt=[PROMPT, "Hello"], echo=True,
                                        stream=True, **GREEDY))
    for i, prompt in enumerate([PROMPT, "Hello"]):                            # 25
        first = next(c for c in chunks if c.choices[0].index == i)
        assert first.choices[0].text.startswith(prompt)


def test_eos_finishes_with_stop(secured_base_server: ServerProcess) -> None:
    greedy = json.loads((Path(secured_base_server.model_dir) / "greedy_eos.json").read_text())
    client = client_for(secured_base_server, api_key=API_KEY)
    c = client.completions.create(model="base", prompt=EOS_PROMPT, temperature=0,
                                  max_tokens=10)                              # 16
    choice = c.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] is None
    assert c.usage.completion_tokens == greedy.index(greedy[-1]) + 1
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(secured_base_server.model_dir)
    assert choice.text == tok.decode(greedy[:greedy.index(greedy[-1])], skip_special_tokens=True)
