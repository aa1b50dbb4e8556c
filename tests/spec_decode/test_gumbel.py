"""Drafter-invariant speculative sampling (rejection_sample_method "gumbel").

A seeded request's tokens are a function of (seed, position, target distribution) alone: the same
with no drafting at all, k = 1, 3, 5, adaptive k (here forced to change every step), a batch-size
schedule, a TLI draft, in a batch or alone, after preemption. A draft equal to its target is always
accepted, even at T = 1; planting unshared noise breaks that. Under the default configuration two
fresh engines give a seeded request the same tokens."""

from __future__ import annotations

import random

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.sample.gumbel import _signed
from tandem.spec_decode.adaptive import AdaptiveK
from tiny_models import build_tiny_model

PARAMS = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True, seed=7),
          SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=11)]


def _tokens(llm: LLM, prompts: list[str], params: SamplingParams) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _spec(target: str, draft: str, k: int, max_model_len: int | None = None,
          kv_cache_memory_bytes: int | None = None, **extra) -> LLM:
    engine = {key: v for key, v in (("max_model_len", max_model_len),
                                    ("kv_cache_memory_bytes", kv_cache_memory_bytes)) if v}
    return LLM(target, seed=3, **engine, speculative_config={
        "model": draft, "num_speculative_tokens": k, "adaptive": False,
        "rejection_sample_method": "gumbel",
        **extra})


def _never_drafts(target: str) -> LLM:
    """Under "gumbel", but k = 0 at every batch size: the draft never runs, every token comes
    from the plain sampler. (A draft-less engine samples as the default method, "auto": seeded
    requests alike, test_auto_method.py.)"""
    return _spec(target, target, 1, num_speculative_tokens_per_batch_size=[[1, 1024, 0]])


@pytest.fixture(scope="module")
def reference(tiny_llama, prompts) -> list[list[list[int]]]:
    llm = _never_drafts(tiny_llama)
    refs = [_tokens(llm, prompts[:4], p) for p in PARAMS]
    assert sum(o.spec_decode_stats.num_draft_tokens
               for o in llm.generate(prompts[:4], PARAMS[0], use_tqdm=False)) == 0
    return refs


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> str:
    """The tiny llama's weights with a flatter LM head: the same argmax, other probabilities,
    so under sampling it agrees only in part."""
    return str(build_tiny_model(tmp_path_factory.mktemp("gumbel") / "draft", "llama",
                                head_scale=2.5))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_seeded_tokens_do_not_depend_on_k(tiny_llama, draft, prompts, reference, k):
    llm = _spec(tiny_llama, draft, k)
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref
        # alone, not batched: the same tokens again
        assert _tokens(llm, prompts[1:2], params) == ref[1:2]
    stats = [o.spec_decode_stats for o in llm.generate(prompts[:4], PARAMS[1], use_tqdm=False)]
    acceptance = (sum(s.num_accepted_tokens for s in stats)
                  / sum(s.num_draft_tokens for s in stats))
    assert 0.1 < acceptance < 0.95  # the draft must be rejected sometimes


def choose_any_k(monkeypatch) -> list[int]:
    """Adaptive speculation, made to pick a random k in 0..k_max every step (as a clock might);
    returns the list of the ks it picked."""
    rng = random.Random(0)
    chosen: list[int] = []

    def anything(self, batch_size: int) -> int:
        chosen.append(rng.randint(0, self.k_max))
        return chosen[-1]

    monkeypatch.setattr(AdaptiveK, "choose", anything)
    return chosen


def test_adaptive_k_cannot_change_seeded_tokens(tiny_llama, draft, prompts, reference,
                                                monkeypatch):
    """Whatever adaptive speculation chooses (here a random k in 0..4 each step, as timing
    might), the tokens stay those of plain decoding."""
    chosen = choose_any_k(monkeypatch)
    llm = _spec(tiny_llama, draft, 4, adaptive=True)
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref
    assert set(chosen) == {0, 1, 2, 3, 4}


def test_tli_draft_gives_the_same_seeded_tokens(tiny_llama, tli_draft, prompts, reference):
    llm = _spec(tiny_llama, tli_draft, 3, use_heterogeneous_vocab=True)
    for params, ref in zip(PARAMS, reference):
        assert _tokens(llm, prompts[:4], params) == ref


def _self_acceptance(target: str, prompts: list[str]) -> float:
    llm = _spec(target, target, 3)
    outs = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True),
                        use_tqdm=False)
    stats = [o.spec_decode_stats for o in outs]
    return sum(s.num_accepted_tokens for s in stats) / sum(s.num_draft_tokens for s in stats)


def test_self_draft_is_always_accepted_at_temperature_1(tiny_llama, prompts):
    assert _self_acceptance(tiny_llama, prompts[:4]) == 1.0


def test_planted_unshared_noise_loses_acceptance(tiny_llama, prompts, monkeypatch):
    """The draft reads another vector than the target (a far position's): still exact (the
    target always emits its own token) but the self-draft is no longer always accepted."""
    from tandem.spec_decode import draft_inputs

    def apart(md, device):
        return torch.tensor([_signed(r.noise_key(p + (1 << 40))) for r, p in
                             zip(md.rngs, md.positions)], dtype=torch.int64, device=device)

    monkeypatch.setattr(draft_inputs, "row_keys", apart)
    assert _self_acceptance(tiny_llama, prompts[:4]) < 0.5


def test_two_fresh_engines_give_seeded_requests_the_same_tokens(tiny_llama, draft, prompts):
    """The default configuration (no keys but model, k; "auto" methods, no adaptive):
    the same seeded tokens twice."""
    def run() -> list[list[int]]:
        llm = LLM(tiny_llama, speculative_config={"model": draft, "num_speculative_tokens": 3,
                                                  "adaptive": False})
        return _tokens(llm, prompts[:3], PARAMS[0])
    assert run() == run()


def test_batch_size_schedule_caps_k_and_keeps_tokens(tiny_llama, draft, prompts, reference):
    """num_speculative_tokens_per_batch_size [[1, 1, 2], [2, 64, 0]]: four requests together
    never draft, one alone drafts 2 a step; the seeded tokens are those of plain decoding."""
    llm = _spec(tiny_llama, draft, 3, num_speculative_tokens_per_batch_size=[[2, 64, 0],
                                                                             [1, 1, 2]])
    outs = llm.generate(prompts[:4], PARAMS[0], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[0]
    assert sum(o.spec_decode_stats.num_draft_tokens for o in outs) == 0
    alone = llm.generate(prompts[1:2], PARAMS[0], use_tqdm=False)[0]
    assert alone.outputs[0].token_ids == reference[0][1]
    stats = alone.spec_decode_stats
    assert stats.num_spec_steps < stats.num_draft_tokens <= 2 * stats.num_spec_steps


def test_batch_size_schedule_lookup_carries_k_over_gaps():
    from tandem.spec_decode.schedule import BatchSizeSchedule
    schedule = BatchSizeSchedule([[9, 16, 1], [1, 4, 5]], 5)  # unsorted, a gap at 5..8
    assert [schedule.cap(b) for b in (1, 4, 5, 8, 9, 16, 17, 100)] == [5, 5, 5, 5, 1, 1, 1, 1]


def test_preemption_keeps_seeded_tokens(tiny_llama, draft, prompts):
    """A KV cache too small for the batch preempts and recomputes requests; the seeded tokens
    stay those of plain decoding with room to spare."""
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=3)
    plain = _tokens(_never_drafts(tiny_llama), prompts, params)
    llm = _spec(tiny_llama, draft, 3, max_model_len=256, kv_cache_memory_bytes=48 * 4096)
    assert _tokens(llm, prompts, params) == plain
    preemptions = [m.value for m in llm.get_metrics() if m.name == "tandem:num_preemptions"]
    assert preemptions and preemptions[0] > 0
