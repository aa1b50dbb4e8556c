"""A lookup's tokens as the draft model's lookahead (spec_decode/lookahead.py): the drafts, and
so every acceptance, are the draft model's own; only its passes are fewer."""
from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.spec_decode.combined import CombinedProposer
from tandem.spec_decode.model_free import NgramLookup
from tandem.spec_decode.model_free_config import LOOKAHEAD_NGRAM
from tandem.spec_decode.proposer import DraftProposer
from test_model_free import REPEATING
from test_spec_greedy import metrics, tokens


ALONE = {"lookup_method": "none"}
NGRAM = {"lookup_method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
DEFAULT: dict = {}  # left out: an n-gram lookahead of 2..5 (SpeculativeConfig._with_draft)


def _run(target: str, draft: str, lookup: dict, params: SamplingParams, prompts: list
         ) -> tuple[list[list[int]], tuple, int]:
    config = {"model": draft, "num_speculative_tokens": 5, "adaptive": False, **lookup}
    llm = LLM(target, speculative_config=config)
    proposer = llm.llm_engine.drafting.proposer
    passes = [0]
    drafter = proposer if lookup is ALONE else proposer.draft
    forward = drafter.forward

    def counted(*args, **kwargs):
        passes[0] += 1
        return forward(*args, **kwargs)

    drafter.forward = counted
    outs = [out for p in prompts for out in llm.generate([p], params, use_tqdm=False)]
    m = metrics(llm)
    return tokens(outs), (m["tandem:spec_decode_num_draft_tokens"],
                          m["tandem:spec_decode_num_accepted_tokens"]), passes[0]


@pytest.mark.parametrize("draft", ["llama", "llama_other"])
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=7, max_tokens=40, ignore_eos=True),
], ids=["greedy", "seeded"])
@pytest.mark.parametrize("lookup", [NGRAM, DEFAULT], ids=["ngram", "default"])
def test_lookahead_drafts_what_the_draft_alone_drafts_in_fewer_passes(tiny_dirs, prompts,
                                                                     draft, params, lookup):
    # The same drafts at every step give the same counts of drafted and accepted tokens; a
    # draft read from a wrong row, or sampled at a wrong position (a seeded request's keyed
    # noise), changes them. The target as its own draft repeats itself, so the lookup's
    # tokens are the draft's and rows are read; an unrelated draft mostly disagrees. One
    # request at a time: a pass runs while any request of the batch still drafts.
    batch = prompts + REPEATING
    alone = _run(tiny_dirs["llama"], tiny_dirs[draft], ALONE, params, batch)
    ahead = _run(tiny_dirs["llama"], tiny_dirs[draft], lookup, params, batch)
    assert ahead[0] == alone[0]
    assert ahead[1] == alone[1]
    if draft == "llama" and (lookup is NGRAM or params.temperature == 0):
        assert ahead[2] < alone[2]  # (the default's 2-grams find no repeat in seeded noise)
    else:
        assert ahead[2] <= alone[2]


def test_a_draft_of_the_target_s_vocabulary_gets_an_ngram_lookahead_unless_told_none(
        tiny_llama, tli_draft):
    def proposer(draft: str, **extra) -> object:
        config = {"model": draft, "num_speculative_tokens": 3, **extra}
        return LLM(tiny_llama, speculative_config=config).llm_engine.proposer

    llm = LLM(tiny_llama, speculative_config={"model": tiny_llama, "num_speculative_tokens": 3,
                                              "adaptive": False})
    default = llm.llm_engine.proposer
    assert isinstance(default, CombinedProposer) and default.lookahead
    lookup = default.lookup.lookup
    assert isinstance(lookup, NgramLookup)
    assert ((lookup.n_min, lookup.n_max) ==
            (LOOKAHEAD_NGRAM["prompt_lookup_min"], LOOKAHEAD_NGRAM["prompt_lookup_max"]))
    seen: set[str] = set()
    propose = lookup.propose
    lookup.propose = lambda req, k: seen.add(req.request_id) or propose(req, k)
    llm.generate(REPEATING, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert len(seen) == len(REPEATING) and lookup.indexes == {}  # dropped as requests finish
    assert isinstance(proposer(tiny_llama, lookup_method="none"), DraftProposer)
    # a TLI draft's tokens are not the lookup's: no lookahead unless asked for (lookup-first)
    assert isinstance(proposer(tli_draft, use_heterogeneous_vocab=True), DraftProposer)
    with pytest.raises(ValueError, match=r"prompt_lookup_min'\] is only valid with method="
                                         r"'ngram' \(or lookup_method='ngram'\)"):
        proposer(tiny_llama, lookup_method="none", prompt_lookup_min=2)
