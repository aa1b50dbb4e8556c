"""rejection_sample_method "auto" (the default): seeded sampled requests as under "gumbel", every
other request as under "standard".

A seeded request's tokens are those of a "gumbel" engine, and the same with no draft at all, k = 1,
3, 5, adaptive k (here a random k every step, as timing might choose), or a TLI draft. Greedy and
unseeded requests get the tokens a "standard" engine gives them. In one batch of all kinds (with
penalties, a grammar and logprobs) each request gets its pure method's tokens. Distribution and
planted-bug tests: test_auto_distribution.py."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from test_gumbel import PARAMS, _tokens, choose_any_k
from test_gumbel import draft  # noqa: F401 - fixture

UNSEEDED = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _engine(target: str, draft: str | None = None, k: int = 3, **extra) -> LLM:  # noqa: F811
    """Engine seed 3 (unseeded requests draw their seeds from it, in admission order)."""
    if draft is None:
        return LLM(target, seed=3)
    return LLM(target, seed=3, speculative_config={"model": draft,
                                                   "num_speculative_tokens": k, "adaptive": False,
                                                   **extra})


def _acceptance(llm: LLM, prompts: list[str], params: SamplingParams) -> float:
    stats = [o.spec_decode_stats for o in llm.generate(prompts, params, use_tqdm=False)]
    return sum(s.num_accepted_tokens for s in stats) / sum(s.num_draft_tokens for s in stats)


@pytest.fixture(scope="module")
def reference(tiny_llama, prompts) -> list[list[list[int]]]:
    """Seeded tokens of an engine without a draft, under the default method."""
    llm = _engine(tiny_llama)
    assert llm.llm_engine.config.speculative_config is None
    return [_tokens(llm, prompts[:4], p) for p in PARAMS]


def test_draft_free_engine_gives_seeded_requests_the_gumbel_tokens(tiny_llama, draft, prompts,
                                                                   reference):
    gumbel = _engine(tiny_llama, draft, rejection_sample_method="gumbel")
    assert [_tokens(gumbel, prompts[:4], p) for p in PARAMS] == reference


@pytest.mark.parametrize("k", [1, 3, 5])
def test_seeded_tokens_do_not_depend_on_k(tiny_llama, draft, prompts, reference, k):
    llm = _engine(tiny_llama, draft, k)
    assert llm.llm_engine.config.speculative_config.rejection_sample_method == "auto"
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref
        assert _tokens(llm, prompts[1:2], params) == ref[1:2]  # alone, not batched
    assert 0.1 < _acceptance(llm, prompts[:4], PARAMS[1]) < 0.95  # rejections happen


def test_adaptive_k_cannot_change_seeded_tokens(tiny_llama, draft, prompts, reference,
                                                monkeypatch):
    chosen = choose_any_k(monkeypatch)
    llm = _engine(tiny_llama, draft, 4, adaptive=True)
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref
    assert set(chosen) == {0, 1, 2, 3, 4}


def test_tli_draft_gives_the_same_seeded_tokens(tiny_llama, tli_draft, prompts, reference):
    llm = _engine(tiny_llama, tli_draft, 3, use_heterogeneous_vocab=True)
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref


def test_greedy_requests_get_the_target_s_own_tokens(tiny_llama, draft, prompts):
    plain = _tokens(_engine(tiny_llama), prompts[:4], GREEDY)
    assert _tokens(_engine(tiny_llama, draft), prompts[:4], GREEDY) == plain


def test_unseeded_requests_get_the_standard_engine_s_tokens(tiny_llama, draft, prompts):
    """The same engine seed draws the same request seeds; "auto" then samples them exactly as
    "standard" does, with a draft and without (a "standard" engine whose schedule never drafts)."""
    standard = _engine(tiny_llama, draft, rejection_sample_method="standard")
    never = _engine(tiny_llama, draft, rejection_sample_method="standard",
                    num_speculative_tokens_per_batch_size=[[1, 1024, 0]])
    auto, auto_plain = _engine(tiny_llama, draft), _engine(tiny_llama)
    for params in UNSEEDED:
        ref = _tokens(standard, prompts[:4], params)
        assert _tokens(auto, prompts[:4], params) == ref
        assert _tokens(auto_plain, prompts[:4], params) == _tokens(never, prompts[:4], params)
    gumbel = _engine(tiny_llama, draft, rejection_sample_method="gumbel")
    assert _tokens(gumbel, prompts[:4], UNSEEDED[1]) != _tokens(auto, prompts[:4], UNSEEDED[1])


MIXED = [
    SamplingParams(temperature=0.8, top_p=0.95, max_tokens=20, ignore_eos=True, seed=7,
                   presence_penalty=0.5),
    SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.2),
    SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=11, logprobs=2),
    SamplingParams(temperature=0.8, top_k=20, max_tokens=20, ignore_eos=True,
                   frequency_penalty=0.3),
    SamplingParams(temperature=1.0, max_tokens=12, seed=5,
                   structured_outputs={"regex": "[a-z ]{1,12}"}),
    SamplingParams(temperature=1.0, max_tokens=12, structured_outputs={"regex": "[a-z ]{1,12}"}),
]


def _outputs(llm: LLM, prompts: list[str]) -> list[tuple[list[int], list | None]]:
    outs = llm.generate(prompts[:len(MIXED)], MIXED, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize("tli", [False, True])
def test_mixed_batch_gives_each_request_its_pure_method_s_tokens(tiny_llama, draft, tli_draft,
                                                                 prompts, tli):
    """One batch of seeded, unseeded and greedy requests: each gets the tokens (and logprobs)
    its pure method's engine gives it in the same batch."""
    extra = {"use_heterogeneous_vocab": True} if tli else {}
    d = tli_draft if tli else draft
    auto = _outputs(_engine(tiny_llama, d, **extra), prompts)
    pure = {m: _outputs(_engine(tiny_llama, d, rejection_sample_method=m, **extra), prompts)
            for m in ("gumbel", "standard")}
    for i, params in enumerate(MIXED):
        method = "gumbel" if params.seed is not None and params.temperature > 0 else "standard"
        assert auto[i] == pure[method][i], (i, method)
    assert auto[3][1] is not None
    # Not vacuous: the two pure methods disagree on every sampled request.
    assert all(pure["gumbel"][i][0] != pure["standard"][i][0]
               for i, p in enumerate(MIXED) if p.temperature > 0)
