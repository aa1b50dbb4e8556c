"""End-to-end generation through the engine on tiny models, against transformers as reference."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def hf_greedy(model_dir: str, prompt_ids: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones_like(ids))
    return out[0, len(prompt_ids):].tolist()


def texts(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def metric(llm: LLM, name: str):
    return next(m.value for m in llm.get_metrics() if m.name == name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_greedy_matches_transformers(tiny_dirs, prompts, arch):
    llm = LLM(tiny_dirs[arch])
    tok = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    outs = llm.generate(prompts[:3], GREEDY, use_tqdm=False)
    for p, out in zip(prompts[:3], outs):
        assert out.prompt_token_ids == tok.encode(p)
        assert out.outputs[0].token_ids == hf_greedy(tiny_dirs[arch], tok.encode(p), 40)
        assert out.outputs[0].finish_reason == "length"
        assert len(out.outputs[0].token_ids) == 40


def test_batch_equals_alone_in_input_order(tiny_llama, prompts):
    llm = LLM(tiny_llama)
    batch = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in batch] == prompts
    alone = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in prompts]
    assert texts(batch) == texts(alone)


def test_preemption_changes_no_output(tiny_llama, prompts):
    ref = texts(LLM(tiny_llama).generate(prompts, GREEDY, use_tqdm=False))
    # 20 blocks of 16 tokens (4 KiB each here: a float16 cache) cannot hold 8 sequences of 45-140
    # tokens at once.
    llm = LLM(tiny_llama, max_model_len=256, kv_cache_memory_bytes=20 * 4096,
              enable_prefix_caching=False)
    assert llm.llm_engine.num_blocks == 20
    assert texts(llm.generate(prompts, GREEDY, use_tqdm=False)) == ref
    assert metric(llm, "tandem:num_preemptions") > 0
    assert llm.llm_engine.num_free_kv_blocks() == 20


def test_chunked_prefill_changes_no_output(tiny_llama, prompts):
    ref = texts(LLM(tiny_llama).generate(prompts, GREEDY, use_tqdm=False))
    llm = LLM(tiny_llama, max_num_batched_tokens=7)
    assert texts(llm.generate(prompts, GREEDY, use_tqdm=False)) == ref


def test_prefix_cache_hits_and_changes_nothing(tiny_llama, prompts):
    prefix = prompts[7] + " " + prompts[2]
    llm = LLM(tiny_llama)
    first = llm.generate(prefix + " One", GREEDY, use_tqdm=False)[0]
    hits_before = metric(llm, "tandem:prefix_cache_hits")
    second = llm.generate(prefix + " Two", GREEDY, use_tqdm=False)[0]
    assert metric(llm, "tandem:prefix_cache_hits") - hits_before >= 32
    assert second.num_cached_tokens >= 32
    fresh = LLM(tiny_llama, enable_prefix_caching=False)
    assert second.outputs[0].token_ids == fresh.generate(prefix + " Two", GREEDY,
                                                         use_tqdm=False)[0].outputs[0].token_ids
    assert first.outputs[0].token_ids == fresh.generate(prefix + " One", GREEDY,
                                                        use_tqdm=False)[0].outputs[0].token_ids


def test_reset_prefix_cache_forgets_prefixes_only_when_no_request_holds_blocks(tiny_llama,
                                                                               prompts):
    prefix = prompts[7] + " " + prompts[2]
    llm = LLM(tiny_llama)
    first = llm.generate(prefix, GREEDY, use_tqdm=False)[0]
    engine = llm.llm_engine
    engine.add_request("held", prefix + " Held", GREEDY)
    engine.step()  # the request now holds blocks, some of them the cached prefix's
    assert llm.reset_prefix_cache() is False
    engine.abort_request("held")
    assert engine.num_free_kv_blocks() == engine.num_blocks
    assert llm.reset_prefix_cache() is True
    again = llm.generate(prefix, GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0  # the prompt computed anew, to the same output
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.generate(prefix, GREEDY, use_tqdm=False)[0].num_cached_tokens >= 32


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_llama, prompts):
    llm = LLM(tiny_llama)
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=20)
    alone = llm.generate(prompts[0], sp, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate(prompts, [sp] + [SamplingParams(temperature=1.0, max_tokens=20)] * 7,
                         use_tqdm=False)[0].outputs[0].token_ids
    assert alone == mixed
    other = llm.generate(prompts[0], SamplingParams(temperature=1.0, top_p=0.9, seed=8,
                                                    max_tokens=20), use_tqdm=False)
    assert other[0].outputs[0].token_ids != alone


def test_n_choices_are_distinct_and_indexed(tiny_llama):
    llm = LLM(tiny_llama)
    out = llm.generate("Hello", SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=12),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_logprobs_equal_log_softmax_of_reference(tiny_llama, prompts):
    llm = LLM(tiny_llama, kv_cache_dtype="float32")  # transformers' float32 numbers, to 1e-4
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    out = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=5, logprobs=3,
                                                  prompt_logprobs=2, ignore_eos=True),
                       use_tqdm=False)[0]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    with torch.no_grad():
        ref_lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0], -1)
    n_prompt = len(out.prompt_token_ids)
    comp = out.outputs[0]
    assert len(comp.logprobs) == 5
    for i, (token, entry) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref_lp[n_prompt - 1 + i]
        assert abs(entry[token].logprob - row[token].item()) < 1e-4
        assert entry[token].rank == 1  # greedy picks the most likely token
        top = row.topk(3).indices.tolist()
        assert set(top) <= set(entry)
        for t in top:
            assert abs(entry[t].logprob - row[t].item()) < 1e-4
    assert comp.cumulative_logprob == pytest.approx(
        sum(ref_lp[n_prompt - 1 + i, t].item() for i, t in enumerate(comp.token_ids)), abs=1e-3)
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == n_prompt
    for i in range(1, n_prompt):
        assert abs(out.prompt_logprobs[i][ids[i]].logprob - ref_lp[i - 1, ids[i]].item()) < 1e-4
    assert tok.decode(comp.token_ids) == comp.text


def test_stop_strings_cut_exactly(tiny_llama, prompts):
    llm = LLM(tiny_llama)
    full = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0].outputs[0]
    text = full.text
    stop = text[10:13]
    assert stop and text.find(stop) == 10
    out = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=40, stop=[stop],
                                                  ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.text == text[:10]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.token_ids) < 40
    kept = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=40, stop=stop,
                                                   include_stop_str_in_output=True,
                                                   ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert kept.text == text[:13]


def test_stop_token_ids_and_max_tokens(tiny_llama, prompts):
    llm = LLM(tiny_llama)
    full = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0].outputs[0]
    target = full.token_ids[5]
    first = full.token_ids.index(target)
    out = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=40,
                                                  stop_token_ids=[target], ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == target
    short = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=3),
                         use_tqdm=False)[0].outputs[0]
    assert len(short.token_ids) <= 3


def test_chat_applies_template(tiny_llama):
    llm = LLM(tiny_llama)
    out = llm.chat([{"role": "user", "content": "Hello"}], GREEDY, use_tqdm=False)[0]
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    want = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                   add_generation_prompt=True)
    assert out.prompt_token_ids == tok.encode(want, add_special_tokens=False)


def test_bad_requests_leave_the_engine_working(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=64)
    free = llm.llm_engine.num_free_kv_blocks()
    with pytest.raises(ValueError, match=r"length 100.*maximum model length of 64"):
        llm.generate([[5] * 100], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[10**6]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", GREEDY, use_tqdm=False)
    assert llm.llm_engine.num_free_kv_blocks() == free
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=100, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 64
    assert llm.llm_engine.num_free_kv_blocks() == free


def test_long_max_model_len_only_when_asked(tiny_llama, monkeypatch):
    """vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets max_model_len pass the model's own (512 here),
    and the positions past it run; without it the error names the variable."""
    with pytest.raises(ValueError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        LLM(tiny_llama, max_model_len=700)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    llm = LLM(tiny_llama, max_model_len=700)
    assert llm.llm_engine.model_config.max_model_len == 700
    out = llm.generate({"prompt_token_ids": [5] * 600},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4


def test_config_errors_name_the_field(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match=r"max_model_len \(100000\) is greater than"):
        LLM(tiny_llama, max_model_len=100000)
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(tiny_llama, dtype="float8")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tiny_llama, tensor_parallel_size=0)
    with pytest.raises(TypeError, match="Unexpected engine argument"):
        LLM(tiny_llama, not_a_flag=1)
    with pytest.raises(FileNotFoundError):
        LLM(str(tmp_path / "missing-model"))


@pytest.mark.parametrize("speculative", [False, True])
def test_min_tokens_masks_stop_tokens(tiny_llama, prompts, speculative):
    spec = {"model": tiny_llama, "num_speculative_tokens": 3,
            "adaptive": False} if speculative else None
    llm = LLM(tiny_llama, speculative_config=spec)
    full = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    stop = full[2]
    out = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=40, min_tokens=10,
                                                  stop_token_ids=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 10
    assert stop not in out.token_ids[:10]
    assert out.token_ids[:2] == full[:2]


def test_min_tokens_leaves_the_logprobs_raw(tiny_llama, prompts):
    """The min_tokens mask is written on sampling's own rows, never on the logits the logprobs
    come from (vLLM's logprobs are the model's): the masked stop token stays the top one."""
    llm = LLM(tiny_llama)
    first = llm.generate(prompts[1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids[0]
    out = llm.generate(prompts[1], SamplingParams(temperature=0, max_tokens=4, min_tokens=3,
                                                  stop_token_ids=[first], logprobs=1),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids[0] != first  # masked for sampling
    entry = out.logprobs[0][first]
    assert entry.rank == 1 and entry.logprob > float("-inf")


def test_common_vllm_arguments_are_accepted(tiny_llama):
    llm = LLM(tiny_llama, enforce_eager=True, trust_remote_code=False, disable_log_stats=True)
    assert not llm.llm_engine.config.log_stats
    assert len(llm.generate("Hi", use_tqdm=False)[0].outputs[0].token_ids) > 0
