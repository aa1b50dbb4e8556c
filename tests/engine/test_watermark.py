"""vLLM's `watermark`: beside running requests, a waiting or preempted request is admitted only if
it leaves that fraction of the KV blocks free, so a cache overfilled by long requests stops
readmitting the request it just preempted (core/scheduler.py). Outputs never change."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.entrypoints.openai.args import engine_kwargs, parse_serve_args

LONG = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)


def _preemptions(llm: LLM) -> int:
    return int(next(m.value for m in llm.get_metrics() if m.name == "tandem:num_preemptions"))


def test_watermark_cuts_preemptions_and_changes_no_output(tiny_llama, prompts) -> None:
    # Four copies of eight prompts of ~70 tokens (a benchmark that cycles its prompts has
    # copies): a request readmitted after a preemption finds its context in its twins' cached
    # blocks, so it comes back at once, and preempting it again frees little (the blocks are
    # shared). 200 blocks of 16 tokens hold about half of the 32 requests at full length.
    texts = [" ".join(prompts[i:] + prompts[:i]) for i in range(len(prompts))]
    many = [t for t in texts for _ in range(4)]
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(tiny_llama, max_model_len=384).generate(
        many, params, use_tqdm=False)]
    outs, preempted = {}, {}
    for w in (0.0, 0.05):
        llm = LLM(tiny_llama, max_model_len=384, kv_cache_memory_bytes=200 * 4096, watermark=w)
        assert llm.llm_engine.num_blocks == 200
        outs[w] = [o.outputs[0].token_ids for o in llm.generate(many, params, use_tqdm=False)]
        preempted[w] = _preemptions(llm)
        assert llm.llm_engine.num_free_kv_blocks() == 200
    assert outs[0.0] == ref and outs[0.05] == ref
    # 38 against 10 when this was written
    assert preempted[0.05] > 0 and preempted[0.0] >= 2 * preempted[0.05], preempted


def test_a_large_watermark_still_serves_every_request(tiny_llama, prompts) -> None:
    # The reserve applies only beside running requests: with nothing running a request that
    # fits is admitted even when it leaves less than the watermark free, so requests run one
    # at a time, never none.
    llm = LLM(tiny_llama, max_model_len=256, kv_cache_memory_bytes=20 * 4096, watermark=0.9)
    out = llm.generate(prompts[:2], LONG, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [120, 120]


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, "0.1", True])
def test_bad_watermark_names_the_field(tiny_llama, bad) -> None:
    with pytest.raises(ValueError, match=r"watermark must be a fraction of the KV cache blocks "
                                         r"in \[0.0, 1.0\)"):
        LLM(tiny_llama, watermark=bad)


def test_serve_flag_reaches_the_engine() -> None:
    assert engine_kwargs(parse_serve_args(["m", "--watermark", "0.05"]))["watermark"] == 0.05
    assert engine_kwargs(parse_serve_args(["m"]))["watermark"] == 0.0
