"""Model-free drafting (method "ngram" and "suffix"): the n-gram lookup on hand-made sequences,
the keys' checks, and greedy output equal to plain decoding through the engine."""

from __future__ import annotations

import itertools
import random

import pytest

from tandem import LLM, SamplingParams
from tandem.spec_decode.adaptive import AdaptiveK
from tandem.spec_decode.ngram import NgramIndex
from test_spec_greedy import metrics, tokens


def lookup(tokens_: list[int], k: int, lo: int = 2, hi: int = 3) -> list[int]:
    return NgramIndex(lo, hi).propose(tokens_, k)


def brute_force(seq: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The rule, spelled out: the longest suffix of lo..hi tokens seen earlier, its latest
    earlier occurrence, and up to k tokens after it."""
    for n in range(min(hi, len(seq) - 1), lo - 1, -1):
        key = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == key:
                return seq[start + n:start + n + k]
    return []


class TestNgramLookup:
    def test_the_longest_suffix_wins(self):
        # [2, 3] occurs followed by 9; [1, 2, 3] occurs followed by 4: the 3-gram decides.
        seq = [2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3]
        assert lookup(seq, 2) == [4, 5]

    def test_the_latest_occurrence_wins_a_tie(self):
        seq = [7, 8, 1, 0, 7, 8, 2, 0, 7, 8]
        assert lookup(seq, 1, lo=2, hi=2) == [2]

    def test_min_and_max_bound_the_match(self):
        seq = [1, 2, 3, 4, 9, 9, 3, 4]  # only a 2-gram ([3, 4]) occurs earlier
        assert lookup(seq, 2, lo=3, hi=4) == []
        assert lookup(seq, 2, lo=2, hi=4) == [9, 9]
        assert lookup([5, 6, 1, 6], 3, lo=1, hi=1) == [1, 6]  # the 1-gram 6, then to the end

    def test_k_caps_the_proposal_and_the_end_of_the_text_cuts_it(self):
        seq = [1, 2, 3, 4, 5, 6, 1, 2]
        assert lookup(seq, 3) == [3, 4, 5]
        assert lookup(seq, 0) == []
        # A period shorter than k: the proposal runs into the request's own last tokens.
        assert lookup([4, 5, 4, 5, 4, 5], 8, lo=2, hi=2) == [4, 5]

    def test_no_match_and_short_texts_propose_nothing(self):
        assert lookup([1, 2, 3, 4], 3) == []
        assert lookup([1], 3, lo=1, hi=1) == []
        assert lookup([], 3, lo=1, hi=1) == []

    def test_an_index_grown_step_by_step_equals_one_built_at_once(self):
        rng = random.Random(0)
        for _ in range(200):
            seq = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
            lo = rng.randint(1, 3)
            hi = rng.randint(lo, 5)
            grown = NgramIndex(lo, hi)
            for end in range(1, len(seq) + 1):
                got = grown.propose(seq[:end], 4)
                assert got == brute_force(seq[:end], 4, lo, hi)
            assert NgramIndex(lo, hi).propose(seq, 4) == got


def test_defaults_are_vllms(tiny_llama):
    from tandem.config import EngineConfig
    ngram = EngineConfig.create(tiny_llama, speculative_config={
        "model": "[ngram]", "num_speculative_tokens": 4}).speculative_config
    assert (ngram.method, ngram.prompt_lookup_min, ngram.prompt_lookup_max) == ("ngram", 5, 5)
    one = EngineConfig.create(tiny_llama, speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (one.speculative_config.prompt_lookup_min,
            one.speculative_config.prompt_lookup_max) == (3, 3)
    suffix = EngineConfig.create(tiny_llama, speculative_config={"method": "suffix"})
    s = suffix.speculative_config
    assert (s.num_speculative_tokens, s.suffix_decoding_max_tree_depth,
            s.suffix_decoding_max_cached_requests, s.suffix_decoding_max_spec_factor,
            s.suffix_decoding_min_token_prob) == (24, 24, 10000, 1.0, 0.1)
    assert suffix.scheduler_config.num_lookahead_tokens == 0  # no draft KV to write ahead
    assert s.draft_model_config is None


# Prompts a tiny random model continues by repeating: lookups find matches in them.
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [11, 12, 13, 11, 12, 13, 11, 12],
             [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]


@pytest.fixture(scope="module")
def plain_reference(tiny_dirs, prompts) -> list[list[int]]:
    llm = LLM(tiny_dirs["llama"])
    return tokens(llm.generate(prompts + REPEATING, SamplingParams(
        temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False))


@pytest.mark.parametrize("config", [
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
     "prompt_lookup_max": 3, "adaptive": False},
    {"method": "ngram", "num_speculative_tokens": 9, "adaptive": True,
     "prompt_lookup_min": 2},
    {"method": "suffix", "num_speculative_tokens": 6, "adaptive": False},
    {"method": "suffix", "adaptive": True, "suffix_decoding_min_token_prob": 0.0,
     "suffix_decoding_max_spec_factor": 2.0},
])
def test_greedy_output_equals_plain_decoding(tiny_dirs, prompts, plain_reference, config,
                                            monkeypatch):
    if config["adaptive"]:  # k changing every step, whatever the machine's timings say
        ks = itertools.cycle((9, 0, 3, 1, 6))
        # a lookup's k by request state: a pair each step, the two often apart
        monkeypatch.setattr(AdaptiveK, "choose_lookup", lambda self, plain, streak: (
            min(next(ks), self.k_max), min(next(ks), self.k_max)))
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    assert tokens(llm.generate(prompts + REPEATING, params, use_tqdm=False)) == plain_reference
    m = metrics(llm)
    assert m["tandem:spec_decode_num_draft_tokens"] > 0  # it really speculated
    assert m["tandem:spec_decode_num_accepted_tokens"] > 0
    # One request at a time, as a server meets them: the same tokens again.
    for prompt, want in zip(REPEATING, plain_reference[len(prompts):]):
        assert tokens(llm.generate([prompt], params, use_tqdm=False)) == [want]
    assert llm.llm_engine.kv.num_free_blocks == llm.llm_engine.num_blocks  # none leaked


def test_adaptive_k_asks_each_request_by_its_state(tiny_dirs, prompts, plain_reference,
                                                   monkeypatch):
    """Under adaptive k a lookup is asked per request: k0 drafts at most for a request whose
    last drafts were not all accepted, k1 for one whose were (here 1 and 5, as if chosen); the
    controller is told how many requests are in each state, learns from each verify under the
    state it was proposed in, and the output stays plain decoding's."""
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(AdaptiveK, "choose_lookup",
                        lambda self, plain, streak: seen.append((plain, streak)) or (1, 5))
    observed: list[tuple[int, int, bool]] = []
    observe = AdaptiveK.observe_acceptance
    monkeypatch.setattr(AdaptiveK, "observe_acceptance", lambda self, d, a, streak=False: (
        observed.append((d, a, streak)), observe(self, d, a, streak)))
    config = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
              "adaptive": True}
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    observed.clear()  # load-time calibration's forced k
    proposer = llm.llm_engine.proposer
    drafts: list[tuple[bool, int]] = []
    propose = proposer.propose

    def recording(reqs):
        total = propose(reqs)
        drafts.extend((r.lookup_streak, len(r.spec_token_ids)) for r in reqs)
        return total

    monkeypatch.setattr(proposer, "propose", recording)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    assert tokens(llm.generate(prompts + REPEATING, params, use_tqdm=False)) == plain_reference
    assert all(n <= 1 for streak, n in drafts if not streak)
    assert all(n <= 5 for streak, n in drafts if streak)
    assert any(n > 1 for streak, n in drafts if streak)  # streaks happened and drafted more
    assert any(streak for _, streak in seen) and any(plain for plain, _ in seen)
    # a verify after a whole acceptance counts as a streak's, the others not
    assert any(s for _, _, s in observed) and any(not s for _, _, s in observed)
    assert all(d <= 1 for d, _, s in observed if not s)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_seeded_sampled_requests_give_the_plain_tokens(tiny_dirs, prompts, method):
    """Under the default rejection method ("auto") a seeded sampled request (cold enough that the
    tiny random model repeats itself, so lookups find something) is verified by
    Gumbel-max coupling: whatever a lookup proposes, its tokens are plain decoding's."""
    batch = prompts + REPEATING
    params = [SamplingParams(temperature=0.05, seed=i, max_tokens=32, ignore_eos=True)
              for i in range(len(batch))]
    want = tokens(LLM(tiny_dirs["llama"]).generate(batch, params, use_tqdm=False))
    config = {"method": method, "num_speculative_tokens": 4, "adaptive": False}
    if method == "ngram":
        config["prompt_lookup_min"] = 1
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    assert tokens(llm.generate(batch, params, use_tqdm=False)) == want
    m = metrics(llm)
    assert 0 < m["tandem:spec_decode_num_accepted_tokens"] < m["tandem:spec_decode_num_draft_tokens"]


@pytest.mark.parametrize("config", [
    {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1, "adaptive": False},
    "draft"])
def test_a_request_turns_speculation_off_or_caps_it(tiny_dirs, plain_reference, prompts, config):
    """SamplingParams.disable_spec_decode / num_speculative_tokens (extra_body on the server):
    that request drafts nothing, or at most its cap per step; the others in its batch as ever."""
    if config == "draft":
        config = {"model": tiny_dirs["llama"], "num_speculative_tokens": 6, "adaptive": False}
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    base = dict(temperature=0, max_tokens=48, ignore_eos=True)
    params = [SamplingParams(**base, disable_spec_decode=True),
              SamplingParams(**base, num_speculative_tokens=2),
              SamplingParams(**base, num_speculative_tokens=0),
              SamplingParams(**base)]
    outs = llm.generate(REPEATING + REPEATING[:1], params, use_tqdm=False)
    assert tokens(outs) == plain_reference[len(prompts):] + plain_reference[len(prompts):][:1]
    off, capped, zero, free = (o.spec_decode_stats for o in outs)
    assert off.num_draft_tokens == 0 and zero.num_draft_tokens == 0
    assert 0 < capped.num_draft_tokens <= 2 * capped.num_spec_steps
    assert free.num_draft_tokens > 2 * free.num_spec_steps  # uncapped, it drafts more


@pytest.mark.parametrize("field,value,message", [
    ("num_speculative_tokens", -1, "num_speculative_tokens must be an integer from 0 (no drafts) "
                                   "to 128, got -1."),
    ("disable_spec_decode", "yes", "disable_spec_decode must be true or false, got 'yes'."),
])
def test_bad_per_request_speculation_fields_are_refused(field, value, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert message in str(e.value)


@pytest.mark.parametrize("lookup", ["ngram", "suffix"])
@pytest.mark.parametrize("vocab", ["shared", "tli"])
def test_a_lookup_beside_a_draft_model(tiny_dirs, tli_draft, prompts, plain_reference, lookup,
                                       vocab):
    """lookup_method: with a draft of the target's vocabulary the lookup is the draft's
    lookahead, and every draft the draft model's (test_lookahead.py); with another vocabulary
    (TLI), a request whose lookup matches verifies the lookup's drafts, the others the draft
    model's, in the same steps. Greedy output is plain decoding's either way."""
    # The target as its own draft: every draft it makes is accepted (an unrelated random draft
    # may have none accepted at all); the TLI draft is the target's layers, so it partly agrees.
    config = {"model": tiny_dirs["llama"], "num_speculative_tokens": 4, "adaptive": False,
              "lookup_method": lookup}
    if vocab == "tli":
        config.update(model=tli_draft, use_heterogeneous_vocab=True)
    if lookup == "ngram":
        config["prompt_lookup_min"] = 2
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = llm.generate(prompts + REPEATING, params, use_tqdm=False)
    assert tokens(outs) == plain_reference
    # Each accepted token names its proposer: "draft" (the model's) or the lookup's name.
    origins = [o for out in outs for c in out.outputs for o in c.token_origins]
    methods = (lookup, "draft_model") if vocab == "tli" else ("draft_model",)
    assert set(origins) == {"target"} | {"draft" if m == "draft_model" else m for m in methods}
    by_method = {(m.name, m.labels.get("method")): m.value for m in llm.get_metrics()
                 if m.name.endswith("_by_method")}
    for method in methods:  # each proposed, and each was verified
        assert by_method[("tandem:spec_decode_num_draft_tokens_by_method", method)] > 0
    total = sum(v for (name, _), v in by_method.items()
                if name == "tandem:spec_decode_num_draft_tokens_by_method")
    assert total == metrics(llm)["tandem:spec_decode_num_draft_tokens"]
    for method in methods:
        origin = "draft" if method == "draft_model" else method
        assert origins.count(origin) == by_method[
            ("tandem:spec_decode_num_accepted_tokens_by_method", method)] > 0
