"""Adaptive speculation: the number of draft tokens for the next step, 0 (no drafting) to K,
chosen from what drafting measurably buys at the current batch size.

The standard expected-tokens-per-cost model. With r_i the probability that draft position i is
accepted given that the positions before it were, a step with k drafts yields per sequence

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} r_j          tokens

and costs, for a batch of B sequences,

    C(k) = T_target(B * (k + 1) tokens) + [k > 0] * (k passes of the draft at batch B)

so the choice is argmax_k B * E(k) / C(k); k = 0 skips the draft altogether (it catches up over
the skipped tokens in one pass when drafting resumes). The target's cost is a line in the number
of tokens it verifies, fitted to the times of decode and verify steps only (a prefill's many
tokens cost per token what a few do not, and tilted the line towards shorter drafts), and each
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

Lossless whatever it picks: every step is an ordinary speculative (or plain) step. Under
rejection_sample_method "standard" a seeded request's tokens then depend on timing (k changes
which uniforms a position uses); under the default "auto" (and "gumbel") they cannot: seeded
requests are sampled by Gumbel-max coupling, whatever k. The controller starts from a load-time
calibration (engine/calibration.py).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Optional


class _CostCurve:
    """Seconds against a size (tokens in a forward, or a batch size), from the recent mean time
    of each size seen (its last `window` times, less those over twice the least of them), each
    weighted by the times it keeps, and a line fitted by least squares to those means.

    Why the least of them: a step the OS preempted takes a timeslice more (4-5 ms where tiny
    models' passes take 0.3 ms, on a machine with both cores busy), and the mean of a size timed
    twice at calibration then priced it out; a size no longer chosen is no longer timed, so the
    price stayed, and adaptive k kept drafting for a useless draft (a quarter of runs under
    load). A slower machine for good still shows: after `window` times, the least is slow too.

    Why means per size: fitted to every observation instead, the line took its slope from the
    few latest steps of an odd size: one slow step of 2 tokens among steps of 1 made a token
    cost half a step. `fit(lo, hi)` uses the sizes within a factor of two of [lo, hi] (where
    there are two), since costs bend between a few tokens and many.

    A size's cost (`at`) is its own mean shrunk towards the line, by `prior_weight`
    observations' worth. The line alone misprices a bend: a verify pass costs the same for 1 to
    4 tokens while it streams the weights, then rises once the multiply-adds take longer
    (measured on an AMD EPYC, 2 cores: 67, 66, 80 and 87 ms for 1, 4, 5 and 6 tokens), and the
    line through them made 4 tokens look 13% dearer and 6 tokens 5% cheaper than they were
    (simulated, 65 steps: 0.93x the best fixed k instead of 0.96x). The mean alone would let
    one slow step price its size out for good; shrunk, a size seen once still leans on the
    line."""

    def __init__(self, window: int = 5, max_sizes: int = 64, prior_weight: float = 1.0
                 ) -> None:
        self.window = window
        self.max_sizes = max_sizes
        self.prior_weight = prior_weight
        self.sizes: dict[int, deque[float]] = {}  # size -> its last `window` times (s)

    def observe(self, size: int, seconds: float) -> None:
        self.sizes.setdefault(size, deque(maxlen=self.window)).append(seconds)
        if len(self.sizes) > self.max_sizes:  # forget the size with the least evidence
            del self.sizes[min((s for s in self.sizes if s != size),
                               key=lambda s: len(self.sizes[s]))]

    def _mean(self, size: int) -> tuple[float, float]:
        """(sum, count) of `size`'s recent times within twice the least of them."""
        times = self.sizes.get(size, ())
        if not times:
            return 0.0, 0.0
        kept = [t for t in times if t <= 2 * min(times)]
        return sum(kept), float(len(kept))

    @property
    def ready(self) -> bool:
        return bool(self.sizes)

    def fit(self, lo: float, hi: float) -> tuple[float, float]:
        """(a, b): seconds ~ a + b * size around [lo, hi]."""
        near = [s for s in self.sizes if lo / 2 <= s <= 2 * hi]
        used = near if len(near) >= 2 else list(self.sizes)
        sums = [self._mean(s) for s in used]
        w = [count for _, count in sums]
        y = [total / count for total, count in sums]
        n = sum(w)
        mean_x = sum(wi * x for wi, x in zip(w, used)) / n
        mean_y = sum(wi * yi for wi, yi in zip(w, y)) / n
        var = sum(wi * (x - mean_x) ** 2 for wi, x in zip(w, used))
        if var <= 1e-12 * max(1.0, mean_x * mean_x):  # one size seen: proportional
            return 0.0, mean_y / mean_x
        slope = max(0.0, sum(wi * (x - mean_x) * (yi - mean_y)
                             for wi, x, yi in zip(w, used, y)) / var)
        return max(0.0, mean_y - slope * mean_x), slope

    def at(self, size: int, line: tuple[float, float]) -> float:
        """The cost of `size`: its mean, shrunk towards `line` (a, b) from `fit`."""
        total, weight = self._mean(size)
        prior = max(1e-6, line[0] + line[1] * size)
        return (total + self.prior_weight * prior) / (weight + self.prior_weight)

    def __call__(self, size: int) -> float:
        return self.at(size, self.fit(size, size))


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
        # A lookup (model-free drafting) proposes only where the text repeats: faded counts of
        # the sequences that got a draft at each position, out of those that could have. None
        # for a draft model, which drafts every position asked for.
        self.covered: Optional[list[float]] = None
        self.offered = [0.0] * k_max
        self.target = _CostCurve()  # seconds per decode/verify forward vs tokens in it
        self.draft = _CostCurve()   # seconds per draft pass vs batch size
        self.steps = 0
        self.last_k = k_max

    def restricted(self, k: int) -> AdaptiveK:
        """This controller (its costs and acceptance evidence) choosing 0..k from its next step
        on, past its warm-up: what a calibrated controller starts from."""
        self.k_max = k
        self.hits, self.misses = self.hits[:k], self.misses[:k]
        self.offered = self.offered[:k]
        if self.covered is not None:
            self.covered = self.covered[:k]
        self.steps = max(self.steps, self.warmup_steps)
        self.last_k = min(self.last_k, k)
        return self

    # ---- measurements ----------------------------------------------------------------------

    def observe_acceptance(self, num_drafted: int, num_accepted: int) -> None:
        """One sequence's verify step: positions 1..accepted+1 were tried (the last rejected
        unless all were accepted)."""
        d = self.decay
        for i in range(min(num_drafted, num_accepted + 1)):
            hit = i < num_accepted
            self.hits[i] = d * self.hits[i] + hit
            self.misses[i] = d * self.misses[i] + (not hit)

    def observe_proposals(self, k: int, lengths: list[int]) -> None:
        """A lookup's step: it was asked for up to k drafts per sequence and proposed
        `lengths`."""
        if self.covered is None:
            self.covered = [0.0] * self.k_max
        d, k = self.decay, min(k, self.k_max)
        ending = [0] * (k + 1)  # sequences whose drafts end at each length (once per step)
        for n in lengths:
            ending[min(n, k)] += 1
        got = len(lengths)
        for i in range(k):
            got -= ending[i]  # now: sequences with more than i drafts
            self.covered[i] = d * self.covered[i] + got
            self.offered[i] = d * self.offered[i] + len(lengths)

    @property
    def lookup(self) -> bool:
        """Drafts come from a lookup: their cost is next to nothing, and no price of k."""
        return self.covered is not None

    def coverage(self) -> list[float]:
        """P(a sequence gets a draft at position i | asked for it): 1 for a draft model; for a
        lookup its faded share, from a prior of one in two (like acceptance's)."""
        if self.covered is None:
            return [1.0] * self.k_max
        return [(c + self.prior_weight * 0.5) / (o + self.prior_weight)
                for c, o in zip(self.covered, self.offered)]

    def observe_target(self, num_tokens: int, seconds: float) -> None:
        """A decode/verify step's forward pass (no prefill in it) over `num_tokens` tokens."""
        self.target.observe(num_tokens, seconds)

    def observe_draft(self, batch_size: int, passes: int, seconds: float) -> None:
        if passes > 0:
            self.draft.observe(batch_size, seconds / passes)

    # ---- the model -------------------------------------------------------------------------

    def _posteriors(self) -> list[tuple[float, float]]:
        """Beta(a, b) for each position's conditional acceptance."""
        out, prior = [], 0.5
        for hits, misses in zip(self.hits, self.misses):
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
        total, p = 1.0, 1.0
        cover = coverage or [1.0] * self.k_max
        for r, c in zip((self.rates if rates is None else rates)[:k], cover):
            p *= r
            total += c * p
        return total

    def costs(self, batch_size: int) -> list[float]:
        """C(k) for k = 0..K at this batch size: one target line and one draft cost for all.
        A lookup's verify pass holds only the drafts it found: B (1 + sum of coverage) tokens."""
        line = self.target.fit(batch_size, batch_size * (self.k_max + 1))
        draft = 0.0 if self.lookup else self.draft(batch_size)
        sizes, size = [batch_size], float(batch_size)
        for c in self.coverage():
            size += batch_size * c
            sizes.append(max(batch_size, round(size)))
        return [self.target.at(n, line) + k * draft for k, n in enumerate(sizes)]

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
        f = self.forget
        self.hits = [f * h for h in self.hits]
        self.misses = [f * m for m in self.misses]
        drawn = [self.rng.betavariate(a, b) for a, b in self._posteriors()]
        costs = self.costs(batch_size)
        cover = self.coverage()
        self.last_k = max(range(self.k_max + 1),
                          key=lambda k: self.expected_tokens(k, drawn, cover) / costs[k])
        return self.last_k
