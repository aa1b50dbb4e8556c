"""A lookup beside a draft model (`"lookup_method": "ngram" | "suffix"` with a draft model): each
step a request whose lookup finds a match verifies the lookup's proposal, and the others the
draft model's, in one verification step.

Why this order: a lookup costs next to nothing and, where the text repeats, proposes runs the
draft model rarely matches (a copied passage, a regenerated JSON object); where nothing
repeats it proposes nothing and the draft model, which knows the language, drafts as ever.

The draft model lets a request alone while its lookup matches, and catches up over what it
missed in one pass when the lookup stops (`DraftProposer`'s catch-up, then its k - 1 steps, in
the same round). Catching up every step instead, over the few tokens each verify accepted, cost
about as much as the draft's own drafting (Gemma 3 drafted by SmolLM2, mixed workload, Intel
Xeon 6/167: 2.39x plain against 2.94x lazily, measured while the benchmark left the suffix tree
full between rounds beside a draft model, so both are high and only their order is a finding).
Against each method alone, request by request (benchmarks/bench_combination.py,
docs/speculation.md), the combination is below the better of the two on each kind of text:
the lookup's matches displace the draft's better runs on free text, and on repeated text its
proposals are capped by the draft's k. Neither a choice per request by acceptance nor the
lookup's own controller (its k per request state, up to 16) lifted the repeated half
(benchmarks/LOG.md): each miss hands the request to a draft that costs k passes and a catch-up.
"""

from __future__ import annotations

from tandem.core.request import Request
from tandem.spec_decode.model_free import ModelFreeProposer
from tandem.spec_decode.proposer import DraftProposer


class CombinedProposer:
    def __init__(self, lookup: ModelFreeProposer, draft: DraftProposer) -> None:
        self.lookup = lookup
        self.draft = draft

    @property
    def k(self) -> int:
        return self.draft.k

    @k.setter
    def k(self, value: int) -> None:  # the drafting phase sets each step's k (adaptive)
        self.lookup.k = self.draft.k = value

    @property
    def learn(self) -> bool:
        return self.lookup.learn

    @learn.setter
    def learn(self, value: bool) -> None:
        self.lookup.learn = value

    def propose(self, reqs: list[Request]) -> int:
        """The lookup first; the draft model drafts for the requests it left without drafts.
        Returns the positions the two proposed or computed."""
        found = self.lookup.propose(reqs)
        rest = [r for r in reqs if not r.spec_token_ids]
        return found + (self.draft.propose(rest) if rest else 0)

    def finished(self, req: Request) -> None:
        self.lookup.finished(req)
