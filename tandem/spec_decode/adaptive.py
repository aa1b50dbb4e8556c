"""Adaptive speculation: the number of draft tokens for the next step, 0 (no drafting) to K,
chosen from what drafting measurably buys at the current batch size.

The standard expected-tokens-per-cost model. With r_i the probability that draft position i is
accepted given that the positions before it were, a step with k drafts yields per sequence

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} r_j          tokens

and costs, for a batch of B sequences,

    C(k) = T_target(B * (k + 1) tokens at batch B) + [k > 0] * (k passes of the draft at batch B)

so the choice is argmax_k B * E(k) / C(k); k = 0 skips the draft altogether (it catches up over
the skipped tokens in one pass when drafting resumes). The target's cost is a line in the number
of tokens it verifies, fitted to the times of decode and verify steps only (a prefill's many
tokens cost per token what a few do not, and tilted the line towards shorter drafts), its slope
what a token costs within a batch and its intercept the batch's own (cost_curve.py), and each
size it has timed leans on its own mean (costs bend where streaming the weights stops being the
bottleneck); the draft's cost per pass is measured the same way against the batch size.

The r_i are not point estimates but Beta posteriors, and each step decides on one draw from
them (Thompson sampling). A point estimate that turns pessimistic by chance (one early rejection
puts a running average at 0) stops the drafting of that position, and with it the observations
that would correct it: measured on a simulated pair, that cost 9% against the best fixed k, and
a tenth of runs lost over a third. Drawing instead tries a position as often as it may still
pay, which shrinks as evidence builds. Evidence fades twice: each observation of a position
weighs the older ones down by `decay`, and every step weighs all of them down by `forget`, so a
draft that was useless long ago is tried again. A position never observed borrows its prior
mean from the one before it (the first from 1/2), `prior_weight` observations' worth.

A lookup (model-free drafting) is asked per request, by its state: the requests whose last
proposal was accepted whole (a copy in progress) keep evidence apart from the others, and each
step picks the pair of k that pays best for the batch's mix of the two (`choose_lookup`). A draft
model's k stays one for the batch: its passes run for all requests at once.

Lossless whatever it picks: every step is an ordinary speculative (or plain) step. Under
rejection_sample_method "standard" a seeded request's tokens then depend on timing (k changes
which uniforms a position uses); under the default "auto" (and "gumbel") they cannot: seeded
requests are sampled by Gumbel-max coupling, whatever k. The controller starts from a load-time
calibration (engine/calibration.py).
"""

from __future__ import annotations

import random
from itertools import accumulate
from typing import Optional, Union

from tandem.spec_decode.cost_curve import CostCurve


def _beyond(asked: list[int], lengths: list[int], top: int) -> tuple[list[int], list[int]]:
    """For each position i < top: how many sequences were asked for more than i drafts, and how
    many of those were given more than i."""
    ask_end = [0] * (top + 1)  # sequences asked for exactly a drafts
    got_end = [0] * (top + 1)  # sequences given exactly n of those
    for a, n in zip(asked, lengths):
        a = min(a, top)
        ask_end[a] += 1
        got_end[min(n, a)] += 1
    offered, got, o, g = [], [], len(asked), len(asked)
    for i in range(top):
        o, g = o - ask_end[i], g - got_end[i]
        offered.append(o)
        got.append(g)
    return offered, got


class AdaptiveK:
    def __init__(self, k_max: int, warmup_steps: int = 1, decay: float = 0.98,
                 forget: float = 0.998, prior_weight: float = 2.0, seed: int = 0) -> None:
        self.k_max = k_max
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.forget = forget
        self.prior_weight = prior_weight
        self.rng = random.Random(seed)
        # Faded counts of acceptances and rejections of each position (given the ones before).
        self.hits = [0.0] * k_max
        self.misses = [0.0] * k_max
        # A lookup's, apart, for the requests whose last proposal was accepted whole: a copy in
        # progress goes on, a proposal after a miss often does not (choose_lookup).
        self.streak_hits = [0.0] * k_max
        self.streak_misses = [0.0] * k_max
        # A lookup (model-free drafting) proposes only where the text repeats: faded counts of
        # the sequences that got a draft at each position, out of those that could have. None
        # for a draft model, which drafts every position asked for.
        self.covered: Optional[list[float]] = None
        self.offered = [0.0] * k_max
        # The part of both that came from streak requests (a copy in progress nearly always
        # finds its next match; after a miss, often nothing): faded at the same positions.
        self.streak_covered = [0.0] * k_max
        self.streak_offered = [0.0] * k_max
        self.target = CostCurve()  # seconds per decode/verify forward vs tokens in it
        self.draft = CostCurve()   # seconds per draft pass vs batch size
        self.steps = 0
        self.last_k = k_max

    def restricted(self, k: int) -> AdaptiveK:
        """This controller (its costs and acceptance evidence) choosing 0..k from its next step
        on, past its warm-up: what a calibrated controller starts from."""
        self.k_max = k
        self.hits, self.misses = self.hits[:k], self.misses[:k]
        self.streak_hits, self.streak_misses = self.streak_hits[:k], self.streak_misses[:k]
        self.offered = self.offered[:k]
        self.streak_covered, self.streak_offered = self.streak_covered[:k], self.streak_offered[:k]
        if self.covered is not None:
            self.covered = self.covered[:k]
        self.steps = max(self.steps, self.warmup_steps)
        self.last_k = min(self.last_k, k)
        return self

    # ---- measurements ----------------------------------------------------------------------

    def observe_acceptance(self, num_drafted: int, num_accepted: int, streak: bool = False
                           ) -> None:
        """One sequence's verify step: positions 1..accepted+1 were tried (the last rejected
        unless all were accepted). `streak`: a lookup's proposal to a request whose previous
        one was accepted whole."""
        d = self.decay
        hits, misses = ((self.streak_hits, self.streak_misses) if streak
                        else (self.hits, self.misses))
        for i in range(min(num_drafted, num_accepted + 1)):
            hit = i < num_accepted
            hits[i] = d * hits[i] + hit
            misses[i] = d * misses[i] + (not hit)

    def observe_proposals(self, k: Union[int, list[int]], lengths: list[int],
                          streaks: Optional[list[bool]] = None) -> None:
        """A lookup's step: it was asked for up to k drafts per sequence (or k[j] for sequence
        j) and proposed `lengths`; `streaks[j]`: sequence j's last drafts were accepted whole."""
        if self.covered is None:
            self.covered = [0.0] * self.k_max
        asked = [k] * len(lengths) if isinstance(k, int) else k
        in_streak = streaks or [False] * len(lengths)
        d, top = self.decay, self.k_max
        offered, got = _beyond(asked, lengths, top)
        s_offered, s_got = _beyond([a for a, s in zip(asked, in_streak) if s],
                                   [n for n, s in zip(lengths, in_streak) if s], top)
        for i in range(top):
            if offered[i] == 0:
                break
            self.covered[i] = d * self.covered[i] + got[i]
            self.offered[i] = d * self.offered[i] + offered[i]
            self.streak_covered[i] = d * self.streak_covered[i] + s_got[i]
            self.streak_offered[i] = d * self.streak_offered[i] + s_offered[i]

    @property
    def lookup(self) -> bool:
        """Drafts come from a lookup: their cost is next to nothing, and no price of k."""
        return self.covered is not None

    def coverage(self, streak: Optional[bool] = None) -> list[float]:
        """P(a sequence gets a draft at position i | asked for it): 1 for a draft model; for a
        lookup its faded share, from a prior of one in two (like acceptance's), over every
        sequence (streak None), the streak ones (True) or the others (False)."""
        if self.covered is None:
            return [1.0] * self.k_max
        pairs = zip(self.covered, self.offered)
        if streak is not None:
            part = zip(self.streak_covered, self.streak_offered)
            pairs = (part if streak else  # the others: all less the streaks' part
                     ((c - sc, o - so) for (c, o), (sc, so) in zip(pairs, part)))
        return [(max(0.0, c) + self.prior_weight * 0.5) / (max(0.0, o) + self.prior_weight)
                for c, o in pairs]

    def observe_target(self, num_tokens: int, seconds: float, batch: int = 0) -> None:
        """A decode/verify step's forward pass (no prefill in it) over `num_tokens` tokens of
        `batch` sequences (0: not told)."""
        self.target.observe(num_tokens, seconds, batch)

    def observe_draft(self, batch_size: int, passes: int, seconds: float) -> None:
        if passes > 0:
            self.draft.observe(batch_size, seconds / passes)

    # ---- the model -------------------------------------------------------------------------

    def _posteriors(self, streak: bool = False) -> list[tuple[float, float]]:
        """Beta(a, b) for each position's conditional acceptance (`streak`: a lookup's after a
        proposal accepted whole)."""
        out, prior = [], 0.5
        evidence = (zip(self.streak_hits, self.streak_misses) if streak
                    else zip(self.hits, self.misses))
        for hits, misses in evidence:
            a = hits + self.prior_weight * prior
            b = misses + self.prior_weight * (1 - prior)
            out.append((a, b))
            prior = a / (a + b)
        return out

    @property
    def rates(self) -> list[float]:
        """Posterior mean acceptance of each position, given the ones before."""
        return [a / (a + b) for a, b in self._posteriors()]

    def expected_tokens(self, k: int, rates: Optional[list[float]] = None,
                        coverage: Optional[list[float]] = None) -> float:
        """Tokens per sequence and step with k drafts asked for: position i is drafted with
        probability coverage[i] (1 for a draft model) and accepted given the ones before."""
        return self._tokens_by_k(self.rates if rates is None else rates, coverage)[k]

    def _tokens_by_k(self, rates: list[float], coverage: Optional[list[float]]) -> list[float]:
        """expected_tokens for k = 0..K in one pass: each k's is the running sum at k."""
        total, p, out = 1.0, 1.0, [1.0]
        for r, c in zip(rates, coverage or [1.0] * self.k_max):
            p *= r
            total += c * p
            out.append(total)
        return out

    def costs(self, batch_size: int) -> list[float]:
        """C(k) for k = 0..K at this batch size: one target line and one draft cost for all.
        A lookup's verify pass holds only the drafts it found: B (1 + sum of coverage) tokens."""
        line = self.target.fit(batch_size, batch_size * (self.k_max + 1), batch_size)
        draft = 0.0 if self.lookup else self.draft(batch_size)
        sizes, size = [batch_size], float(batch_size)
        for c in self.coverage():
            size += batch_size * c
            sizes.append(max(batch_size, round(size)))
        return [self.target.at(n, line, batch_size) + k * draft for k, n in enumerate(sizes)]

    # ---- the choice ------------------------------------------------------------------------

    def choose(self, batch_size: int) -> int:
        """k for the next step of a batch of `batch_size` sequences."""
        self.steps += 1
        if batch_size <= 0:
            return self.last_k
        if self.steps <= self.warmup_steps or not (self.target.ready
                                                   and (self.lookup or self.draft.ready)):
            self.last_k = self.k_max  # measure everything first
            return self.last_k
        self._fade()
        drawn = [self.rng.betavariate(a, b) for a, b in self._posteriors()]
        costs = self.costs(batch_size)
        gains = self._tokens_by_k(drawn, self.coverage())
        self.last_k = max(range(self.k_max + 1), key=lambda k: gains[k] / costs[k])
        return self.last_k

    def choose_lookup(self, plain: int, streak: int) -> tuple[int, int]:
        """A lookup's k for the next step: (k for the `plain` requests, k for the `streak`
        ones, whose last proposal was accepted whole), the pair that maximizes the batch's
        expected tokens per second. One k for all wastes verify rows at one end or tokens at
        the other: replaying n-gram lookups over SmolLM2's greedy outputs of the repetitive
        prompts at an AMD EPYC's verify costs (`benchmarks/lookup_policy_replay.py`), the best
        pair beat the best single k by 5-9% (k = 1-2 after a miss, 6 in a streak)."""
        batch = plain + streak
        self.steps += 1
        if batch <= 0:
            return self.last_k, self.last_k
        if self.steps <= self.warmup_steps or not self.target.ready:
            self.last_k = self.k_max
            return self.k_max, self.k_max
        self._fade()
        # Per state and k = 0..K, times the state's requests: the expected tokens (one draw of
        # its posteriors) and the expected drafts verified (the sum of its coverage). A state
        # without requests takes k = 0 alone.
        gains, drafts = [], []
        for state, n in ((False, plain), (True, streak)):
            if not n:  # nothing to draw for (a draw per position is most of a choice's time)
                gains.append([0.0])
                drafts.append([0.0])
                continue
            cover = self.coverage(state)
            drawn = [self.rng.betavariate(a, b) for a, b in self._posteriors(state)]
            gains.append([n * g for g in self._tokens_by_k(drawn, cover)])
            drafts.append([n * f for f in accumulate(cover, initial=0.0)])
        line = self.target.fit(batch, batch * (self.k_max + 1), batch)
        priced: dict[int, float] = {}
        best, pair = -1.0, (0, 0)
        for k0, (g0, d0) in enumerate(zip(gains[0], drafts[0])):
            for k1, (g1, d1) in enumerate(zip(gains[1], drafts[1])):
                size = max(batch, round(batch + d0 + d1))
                if size not in priced:
                    priced[size] = self.target.at(size, line, batch)
                rate = (g0 + g1) / priced[size]
                if rate > best:
                    best, pair = rate, (k0, k1)
        self.last_k = max(pair)
        return pair

    def _fade(self) -> None:
        """Every step weighs all acceptance evidence down by `forget`."""
        f = self.forget
        self.hits = [f * h for h in self.hits]
        self.misses = [f * m for m in self.misses]
        self.streak_hits = [f * h for h in self.streak_hits]
        self.streak_misses = [f * m for m in self.streak_misses]
