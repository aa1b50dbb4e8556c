"""A lookup beside a draft model (`"lookup_method": "ngram" | "suffix"` with a draft model).

With a draft of the target's vocabulary, the lookup is the draft model's lookahead
(lookahead.py): the tokens it expects are fed after the context in the draft's catch-up pass,
and while the draft's own tokens equal them, each next draft is read from a row already
computed instead of a pass of its own. Every draft, and its q, is the draft model's: the
lookup spares passes where the text repeats and never displaces a draft on free text.
Request by request against each method alone (benchmarks/bench_combination.py, the synthetic
pair, AMD EPYC family 26 model 2, three runs of two rounds): 2.50-2.68x plain against
2.26-2.52x for the draft model alone and 2.24-2.43x for the suffix lookup alone; the way before
it (below) gave 2.42-2.44x.

With a draft of another vocabulary (TLI), whose tokens are not the lookup's, each step a
request whose lookup finds a match verifies the lookup's proposal, and the others the draft
model's, in one verification step; the draft model lets a request alone while its lookup
matches, and catches up over what it missed in one pass when the lookup stops
(`DraftProposer`'s catch-up, then its k - 1 steps, in the same round). That way the lookup's
matches displace the draft's better runs on free text (docs/speculation.md).

Without `lookup_method`, a draft of the target's vocabulary gets an n-gram lookahead (the
config says so: SpeculativeConfig fills it in): it changes no draft, so what a user sees of the
draft model is the same, only fewer of its passes.
"""

from __future__ import annotations

from typing import Any, Union

from tandem.core.request import Request
from tandem.spec_decode.draft_inputs import SharedVocabDraft
from tandem.spec_decode.model_free import ModelFreeProposer, build_model_free_proposer
from tandem.spec_decode.model_free_config import LOOKUP_OFF
from tandem.spec_decode.proposer import DraftProposer


class CombinedProposer:
    def __init__(self, lookup: ModelFreeProposer, draft: DraftProposer) -> None:
        self.lookup = lookup
        self.draft = draft
        # the lookup as the draft's lookahead, where they share a vocabulary
        self.lookahead = isinstance(draft.inputs, SharedVocabDraft)

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
        """The lookup first: as the draft model's lookahead for every request (a shared
        vocabulary), or as the proposal of the requests it matches, the draft model drafting
        for the others (TLI). Returns the positions the two proposed or computed."""
        if not self.lookahead:
            found = self.lookup.propose(reqs)
            rest = [r for r in reqs if not r.spec_token_ids]
            return found + (self.draft.propose(rest) if rest else 0)
        pending = {r.request_id for r in reqs if r.spec_token_ids}  # drafts still to verify
        self.lookup.propose(reqs)
        hints: dict[str, list[int]] = {}
        for r in reqs:
            if r.spec_token_ids and r.request_id not in pending:
                hints[r.request_id], r.spec_token_ids = r.spec_token_ids, []
        return self.draft.propose(reqs, hints)

    def finished(self, req: Request) -> None:
        self.lookup.finished(req)


def with_lookup(spec: Any, draft: DraftProposer, max_len: int
                ) -> Union[DraftProposer, CombinedProposer]:
    """The draft model's proposer with the config's lookup beside it (`lookup_method`, which
    SpeculativeConfig sets to an n-gram lookahead where it was left out and the draft shares
    the target's vocabulary), or the draft alone ("none", or a TLI draft left without one).
    `max_len`: the target's length (the lookup reads the target's tokens)."""
    if spec.lookup_method in (None, LOOKUP_OFF):
        return draft
    return CombinedProposer(build_model_free_proposer(spec, max_len), draft)
