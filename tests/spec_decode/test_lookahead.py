"""A lookup's tokens as the draft model's lookahead (spec_decode/lookahead.py): the drafts, and
so every acceptance, are the draft model's own; only its passes are fewer."""
from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from test_model_free import REPEATING
from test_spec_greedy import metrics, tokens


def _run(target: str, draft: str, lookahead: bool, params: SamplingParams, prompts: list
         ) -> tuple[list[list[int]], tuple, int]:
    config = {"model": draft, "num_speculative_tokens": 5, "adaptive": False}
    if lookahead:
        config.update(lookup_method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)
    llm = LLM(target, speculative_config=config)
    proposer = llm.llm_engine.drafting.proposer
    passes = [0]
    drafter = proposer.draft if lookahead else proposer
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
def test_lookahead_drafts_what_the_draft_alone_drafts_in_fewer_passes(tiny_dirs, prompts,
                                                                     draft, params):
    # The same drafts at every step give the same counts of drafted and accepted tokens; a
    # draft read from a wrong row, or sampled at a wrong position (a seeded request's keyed
    # noise), changes them. The target as its own draft repeats itself, so the lookup's
    # tokens are the draft's and rows are read; an unrelated draft mostly disagrees. One
    # request at a time: a pass runs while any request of the batch still drafts.
    batch = prompts + REPEATING
    alone = _run(tiny_dirs["llama"], tiny_dirs[draft], False, params, batch)
    ahead = _run(tiny_dirs["llama"], tiny_dirs[draft], True, params, batch)
    assert ahead[0] == alone[0]
    assert ahead[1] == alone[1]
    if draft == "llama":
        assert ahead[2] < alone[2]
    else:
        assert ahead[2] <= alone[2]
