"""Drafting without a draft model: `ModelFreeProposer` asks a lookup over the request's own
tokens (n-gram, `ngram.py`; suffix tree, `suffix_tree.py`) for up to k drafts, and stores them
as the draft proposer does, so verification, adaptive k and the metrics are the same path.

A model-free draft is a point guess: its q is one-hot (`draft_probs` None), which the rejection
sampler already handles (accept x with probability p(x); on a rejection, sample p with x taken
out), and a request coupled by Gumbel-max is verified by token equality, as ever. Where the
lookup finds nothing the request gets no drafts and costs nothing: its step is a plain one.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from tandem.core.request import Request
from tandem.spec_decode.ngram import NgramIndex
from tandem.spec_decode.suffix_tree import SuffixCache


class Proposer(Protocol):
    """What the engine's drafting phase uses of a proposer (a draft model's or model-free)."""
    k: int

    def propose(self, reqs: list[Request]) -> int: ...


class Lookup(Protocol):
    name: str  # the method, as speculative_config names it

    def propose(self, req: Request, k: int) -> list[int]: ...
    def finished(self, req: Request, keep: bool) -> None: ...


class NgramLookup:
    """An n-gram index per running request, built as its tokens arrive."""
    name = "ngram"

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.indexes: dict[str, NgramIndex] = {}

    def propose(self, req: Request, k: int) -> list[int]:
        index = self.indexes.get(req.request_id)
        if index is None:
            index = self.indexes[req.request_id] = NgramIndex(self.n_min, self.n_max)
        return index.propose(req.all_token_ids, k)

    def finished(self, req: Request, keep: bool) -> None:
        self.indexes.pop(req.request_id, None)


class SuffixLookup:
    """Suffix decoding: a tree over each request's prompt and output, and one over the outputs
    of recent requests (`SuffixCache`); the better-scoring continuation of the request's last
    tokens, its length scaled by the match's (max_spec_factor) and cut where its probability
    falls under min_token_prob."""
    name = "suffix"

    def __init__(self, max_depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float) -> None:
        self.cache = SuffixCache(max_depth, max_cached_requests)
        self.max_depth = max_depth
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob

    def propose(self, req: Request, k: int) -> list[int]:
        rid = req.request_id
        if not self.cache.active(rid):
            self.cache.start(rid, req.prompt_token_ids)
        self._feed(req)
        if k <= 0:
            return []
        pattern = req.all_token_ids[-self.max_depth:]
        return self.cache.speculate(rid, pattern, k, self.max_spec_factor, self.min_token_prob)

    def finished(self, req: Request, keep: bool) -> None:
        """With `keep`, its output joins the cross-request tree (the oldest cached one leaves)."""
        rid = req.request_id
        if not self.cache.active(rid):
            return
        if keep:
            self._feed(req)
            self.cache.finish(rid)
        else:
            self.cache.drop(rid)

    def _feed(self, req: Request) -> None:
        """The output tokens the request's tree has not seen yet (drafts never enter it)."""
        seen = self.cache.num_output(req.request_id)
        if len(req.output_token_ids) > seen:
            self.cache.append(req.request_id, req.output_token_ids[seen:])

    def clear_cache(self) -> None:
        """Forget the finished requests' outputs (what `bench_model_free.py` does between runs
        of the same prompts)."""
        self.cache.clear_global()


class ModelFreeProposer:
    def __init__(self, lookup: Lookup, num_speculative_tokens: int, max_len: int) -> None:
        self.lookup = lookup
        self.k = num_speculative_tokens
        # Adaptive k's choice per request state (AdaptiveK.choose_lookup): at most by_streak[0]
        # drafts for a request whose last drafts were not all accepted, by_streak[1] for one
        # whose were; None: k for every request.
        self.by_streak: Optional[tuple[int, int]] = None
        self.max_len = max_len  # drafting stops here (the target's, or speculative max_model_len)
        # Load-time calibration times every verify size, so it wants k drafts at every step,
        # found or not: with `fill`, a short proposal is padded (with the last token; what is
        # verified does not matter to a timing, and verification stays lossless).
        self.fill = False
        # Whether finished requests teach the lookup (suffix decoding keeps their outputs);
        # calibration's sample text does not.
        self.learn = True

    def propose(self, reqs: list[Request]) -> int:
        """Set `spec_token_ids` on each request (none where the lookup finds nothing); returns
        the number of drafts proposed."""
        total = 0
        for req in reqs:
            if req.spec_token_ids:
                continue  # drafts still to verify (the step skipped it, or it was preempted)
            req.awaiting_drafts = False  # a lookup never keeps a request waiting
            k = req.drafts_allowed(self.asked(req), self.max_len)
            drafts = self.lookup.propose(req, k) if k > 0 else []
            drafts = _grammar_prefix(req.grammar, drafts[:k])
            if self.fill and k > 0:
                drafts = (drafts + [req.all_token_ids[-1]] * k)[:k]
            req.spec_token_ids = drafts
            req.draft_probs = None  # one-hot q
            req.draft_method = self.lookup.name
            total += len(drafts)
        return total

    def asked(self, req: Request) -> int:
        """The most drafts this step's k allows `req` (by its state, under adaptive k)."""
        if self.by_streak is None:
            return self.k
        return min(self.k, self.by_streak[req.lookup_streak])

    def finished(self, req: Request) -> None:
        self.lookup.finished(req, keep=self.learn)


def _grammar_prefix(grammar: Optional[Any], drafts: Sequence[int]) -> list[int]:
    """The drafts up to the first one a request's grammar would refuse (structured outputs): a
    refused draft can never be accepted, and the ones after it are then never verified."""
    if grammar is None or not drafts:
        return list(drafts)
    walked = 0
    try:
        for token in drafts:
            if not grammar.try_consume(token):
                break
            walked += 1
    finally:
        grammar.rollback(walked)  # the grammar advances on verified tokens only
    return list(drafts[:walked])


def build_model_free_proposer(spec: Any, max_len: int) -> ModelFreeProposer:
    """The lookup proposer of a config whose method (or lookup_method, beside a draft model) is
    "ngram" or "suffix", its keys resolved; drafting stops at `max_len` tokens."""
    method = spec.method if spec.model_free else spec.lookup_method
    if method == "ngram":
        lookup: Lookup = NgramLookup(spec.prompt_lookup_min, spec.prompt_lookup_max)
    else:
        lookup = SuffixLookup(spec.suffix_decoding_max_tree_depth,
                              spec.suffix_decoding_max_cached_requests,
                              spec.suffix_decoding_max_spec_factor,
                              spec.suffix_decoding_min_token_prob)
    return ModelFreeProposer(lookup, spec.num_speculative_tokens, max_len)
