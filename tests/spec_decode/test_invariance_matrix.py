"""Lossless at every batch size and every k (issue 44): greedy speculative output equals plain
output, and seeded sampled requests (drawn by Gumbel-max under the default rejection method) get
the same tokens, at 1, 16 and 64 streams, k in {1, 4, 8, 20, 32}, on float32, Q8_0, Q4_K and
GGUF-kept Q4_1/Q8_0/F16/BF16 weights, with prompts the token budget chunks (differently beside
drafts than without), on every architecture, with a TLI draft and at tensor_parallel_size 2.

Tokens alone would be a weak witness: a tiny model rarely has a near-tie within a last bit. So
every request also asks for its logprobs, which are the target's logits of each position, and
those must be equal to the bit: `test_a_planted_batch_dependence_is_caught` shows the matrix
failing when verification of more than 16 tokens takes another attention path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from loader.test_gguf import _write_gguf
from tandem import LLM, SamplingParams
from tandem.attention import sdpa_backend
from tandem.kernels import cpu_build
from tiny_models import build_tiny_model

# Batch invariance is a property of the CPU kernels (without a C compiler torch's ops run).
pytestmark = pytest.mark.skipif(cpu_build._compiler() is None, reason="no C compiler")

KS = (1, 4, 8, 20, 32)
STREAMS = (1, 16, 64)
BUDGET = 1024  # max_num_batched_tokens: the prompt at the budget's edge is chunked
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1)

WORDS = ("the draft proposes tokens and the target checks them all in one pass so that "
         "generation is faster while the output stays exactly the same as without it").split()


def prompts(n: int) -> list[str]:
    """n prompts of 3 to about 110 tokens, different from one another."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + (i * 37) % 90))
            for i in range(n)]


def requests(n: int) -> tuple[list[str], list[SamplingParams]]:
    """n prompts; every fourth request sampled with a seed of its own, the rest greedy."""
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=i, max_tokens=20, ignore_eos=True,
                             logprobs=1) if i % 4 == 3 else GREEDY for i in range(n)]
    return prompts(n), params


Output = list[tuple[int, tuple[tuple[int, float], ...]]]


def run(llm: LLM, n: int) -> list[Output]:
    """Each request's tokens, each with its position's logprobs (the chosen and the top one)."""
    texts, params = requests(n)
    return [[(t, tuple(sorted((i, lp.logprob) for i, lp in lps.items())))
             for t, lps in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
            for o in llm.generate(texts, params, use_tqdm=False)]


def engine(model: str, k: int = 0, draft: str | None = None, **kw) -> LLM:
    spec = {} if k == 0 else {"speculative_config": {
        "model": draft or model, "num_speculative_tokens": k, "adaptive": False,
        **({"quantization": kw["quantization"]} if "quantization" in kw else {})}}
    return LLM(model, max_num_seqs=64, max_num_batched_tokens=BUDGET, seed=0,
               enable_prefix_caching=False, **spec, **kw)


@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> dict[str, str]:
    """A llama whose rows (256, 512) Q4_K divides, its logits flat; a draft that agrees with it
    about half the time (its own weights with noise); and the target as a GGUF file of kept
    Q4_1, Q8_0, F16 and BF16 blocks."""
    root = tmp_path_factory.mktemp("flat")
    target = build_tiny_model(root / "target", "llama", hidden=256, head_scale=0.25)
    draft = build_tiny_model(root / "draft", "llama", hidden=256, head_scale=0.25)
    from safetensors.torch import load_file, save_file
    t, d = load_file(str(target / "model.safetensors")), load_file(str(draft / "model.safetensors"))
    # the target's weights plus noise of half their spread (none on constant ones: the norms)
    save_file({n: t[n] + 0.5 * t[n].std() * d[n] / d[n].std() if d[n].std() > 0 else t[n]
               for n in t}, str(draft / "model.safetensors"))
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    types = {n: Q.Q8_0 if ".self_attn." in n else Q.Q4_1 for n in model.state_dict()
             if n.endswith("proj.weight")}
    types["model.layers.0.mlp.up_proj.weight"] = Q.F16
    types["model.layers.0.self_attn.o_proj.weight"] = Q.BF16
    gguf = root / "target-q4_1.gguf"
    _write_gguf(gguf, "llama", model.config, model.state_dict(), types)
    return {"target": str(target), "draft": str(draft), "gguf": str(gguf)}


WEIGHTS = {"float32": {"quantization": "none"}, "q8_0": {"quantization": "q8_0"},
           "q4_k": {"quantization": "q4_k"}, "gguf": {}}


def _model(flat: dict[str, str], weights: str) -> tuple[str, dict]:
    if weights == "gguf":
        return flat["gguf"], {"tokenizer": flat["target"]}
    return flat["target"], dict(WEIGHTS[weights])


@pytest.fixture(scope="module")
def plain_outputs(flat) -> dict[str, list[Output]]:
    """Plain decoding of 64 requests per weight type, checked against 1 and 16 streams."""
    out = {}
    for weights in WEIGHTS:
        model, kw = _model(flat, weights)
        llm = engine(model, **kw)
        out[weights] = run(llm, 64)
        assert run(llm, 16) == out[weights][:16] and run(llm, 1) == out[weights][:1]
    return out


@pytest.mark.parametrize("weights", list(WEIGHTS))
def test_speculation_equals_plain_at_every_batch_and_k(flat, plain_outputs, weights):
    model, kw = _model(flat, weights)
    want = plain_outputs[weights]
    for k in KS:
        llm = engine(model, k, flat["draft"], **kw)
        for n in STREAMS:
            got = run(llm, n)
            bad = [i for i in range(n) if got[i] != want[i]]
            assert not bad, f"{weights}, k={k}, {n} streams: requests {bad} differ from plain"
        m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
        rate = (m["tandem:spec_decode_num_accepted_tokens"]
                / m["tandem:spec_decode_num_draft_tokens"])
        assert 0.05 < rate < 0.95, rate  # drafts accepted and rejected: roll-backs are exercised


@pytest.mark.parametrize("weights", ["float32", "gguf"])
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_lookups_equal_plain_at_64_streams_and_k_20(flat, plain_outputs, weights, method):
    """Model-free drafts (the prompts repeat their words, so lookups find plenty) verified 20 at a
    time beside 63 other requests, chunked prompts among them: plain decoding's bits."""
    model, kw = _model(flat, weights)
    llm = LLM(model, max_num_seqs=64, max_num_batched_tokens=BUDGET, seed=0,
              enable_prefix_caching=False, speculative_config={
                  "method": method, "num_speculative_tokens": 20, "adaptive": False,
                  **({"prompt_lookup_min": 2} if method == "ngram" else {})}, **kw)
    got = run(llm, 64)
    bad = [i for i in range(64) if got[i] != plain_outputs[weights][i]]
    assert not bad, f"{weights}, {method}: requests {bad} differ from plain"
    m = {x.name: x.value for x in llm.get_metrics() if hasattr(x, "value")}
    assert m["tandem:spec_decode_num_accepted_tokens"] > 0  # lookups were verified, and paid


def test_a_planted_batch_dependence_is_caught(flat, plain_outputs, monkeypatch):
    """Requests verifying more than 16 tokens sent to SDPA (the old path): the matrix fails."""
    real = sdpa_backend.paged_attention

    def planted(q, k_cache, v_cache, meta, scale, window, softcap=None):
        if max(meta.query_lens) > 16:
            meta.requests = None
        return real(q, k_cache, v_cache, meta, scale, window, softcap)

    monkeypatch.setattr(sdpa_backend, "paged_attention", planted)
    monkeypatch.setattr("tandem.layers.attention.paged_attention", planted)
    # layer by layer (the fused stack, bit-identical to it, calls the kernel itself)
    monkeypatch.setattr("tandem.models.llama.fused_stack", lambda model, x, rope: None)
    model, kw = _model(flat, "float32")
    got = run(engine(model, 20, flat["draft"], **kw), 16)
    assert got != plain_outputs["float32"][:16]


ARCHS = ("qwen2", "qwen3", "gemma3")
DENSE = ("phi3", "gemma2", "olmo2", "granite", "gemma3_mm")


@pytest.fixture(scope="module")
def flat_archs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("flat_archs")
    return {arch: str(build_tiny_model(root / arch, arch, head_scale=0.25))
            for arch in ARCHS + DENSE}


@pytest.mark.parametrize("arch", ARCHS + DENSE)
def test_every_architecture(flat_archs, arch):
    model = flat_archs[arch]
    want = run(engine(model), 16)
    assert run(engine(model, 20), 16) == want
    assert run(engine(model, 4, quantization="q8_0"), 16) == run(engine(model,
                                                                        quantization="q8_0"), 16)


def test_a_tli_draft(tiny_dirs, tli_draft):
    want = run(engine(tiny_dirs["llama"]), 16)
    llm = LLM(tiny_dirs["llama"], max_num_seqs=64, max_num_batched_tokens=BUDGET, seed=0,
              speculative_config={"model": tli_draft, "num_speculative_tokens": 20,
                                  "adaptive": False, "use_heterogeneous_vocab": True})
    assert run(llm, 16) == want


def test_qwen3_moe(tmp_path):
    from tiny_moe import build_tiny_moe
    model = str(build_tiny_moe(tmp_path / "moe"))
    assert run(engine(model, 20), 16) == run(engine(model), 16)


def test_tensor_parallel(flat):
    """At tensor_parallel_size 2 (real gloo processes; the all-reduce sums two ranks' parts,
    a + b whatever the tensor's size)."""
    model, kw = _model(flat, "float32")
    plain = run(engine(model, tensor_parallel_size=2, **kw), 16)
    assert run(engine(model, 20, flat["draft"], tensor_parallel_size=2, **kw), 16) == plain


@pytest.mark.parametrize("weights", ["float32", "gguf"])
def test_a_prompt_does_not_depend_on_its_chunks(flat, weights):
    """Prompt logprobs (every prompt position's logits) and the output: the same bits whether
    the prompt is prefilled whole, in chunks of 16, or beside 15 other requests."""
    model, kw = _model(flat, weights)
    params = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=1, logprobs=1)

    long_prompt = prompts(18)[17]  # 91 words

    def first(llm: LLM, n: int) -> tuple:
        out = llm.generate(prompts(n - 1) + [long_prompt], params, use_tqdm=False)[-1]
        assert len(out.prompt_token_ids) > 90
        return (out.outputs[0].token_ids,
                [None if lp is None else sorted((i, p.logprob) for i, p in lp.items())
                 for lp in out.prompt_logprobs],
                [sorted((i, p.logprob) for i, p in lp.items()) for lp in out.outputs[0].logprobs])

    whole = first(LLM(model, max_num_batched_tokens=4096, seed=0, **kw), 1)
    assert first(LLM(model, max_num_batched_tokens=16, max_num_seqs=4, seed=0, **kw), 1) == whole
    assert first(LLM(model, max_num_batched_tokens=BUDGET, seed=0, **kw), 16) == whole
