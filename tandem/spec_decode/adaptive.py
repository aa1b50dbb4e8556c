"""Adaptive speculation: the number of draft tokens for the next step, 0 (no drafting) to K,
chosen from what drafting measurably buys at the current batch size.

The standard expected-tokens-per-cost model. With r_i the probability that draft position i is
accepted given that the positions before it were, a step with k drafts yields per sequence

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} r_j          tokens

and costs, for a batch of B sequences,

    C(k) = T_target(B * (k + 1) tokens) + [k > 0] * (k passes of the draft at batch B)

so the choice is argmax_k B * E(k) / C(k); k = 0 skips the draft altogether (it catches up over
the skipped tokens in one pass when drafting resumes). r_i are exponentially weighted averages of
the observed acceptances; the target's cost is a line in the number of tokens it verifies, and
the draft's a line in the batch size, both fitted by exponentially weighted least squares from
measured step times. Positions not drafted lately keep their last estimate. After
`probe_interval` steps at some k < K, one step drafts k + 1, so a draft that became more useful
is noticed; a probe that changes nothing doubles the interval (up to `max_probe_interval`), so
a useless draft costs ever less.

Lossless whatever it picks: every step is an ordinary speculative (or plain) step. Seeded
sampling then depends on timing, as the choice of k changes which uniforms a position uses.
"""

from __future__ import annotations

from typing import Optional


class _LineFit:
    """y ~ a + b x by exponentially weighted least squares."""

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y

    @property
    def ready(self) -> bool:
        return self.n > 0

    def __call__(self, x: float) -> float:
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mean_x * mean_x
        if var <= 1e-12 * max(1.0, mean_x * mean_x):  # one x seen so far: proportional
            return mean_y * (x / mean_x) if mean_x > 0 else mean_y
        slope = max(0.0, (self.sxy / self.n - mean_x * mean_y) / var)
        return max(1e-6, mean_y + slope * (x - mean_x))


class AdaptiveK:
    def __init__(self, k_max: int, warmup_steps: int = 1, probe_interval: int = 32,
                 max_probe_interval: int = 512, decay: float = 0.9) -> None:
        self.k_max = k_max
        self.warmup_steps = warmup_steps
        self.probe_interval = probe_interval
        self.base_probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.decay = decay
        self.rates: list[Optional[float]] = [None] * k_max  # r_i, conditional acceptance
        self.target = _LineFit()  # seconds per forward vs tokens verified
        self.draft = _LineFit()   # seconds per draft pass vs batch size
        self.steps = 0
        self._since_probe = 0
        self._settled = k_max  # the last choice made by the model (not a probe)
        self.last_k = k_max

    # ---- measurements ----------------------------------------------------------------------

    def observe_acceptance(self, num_drafted: int, num_accepted: int) -> None:
        """One sequence's verify step: positions 1..accepted+1 were tried (the last rejected
        unless all were accepted)."""
        for i in range(min(num_drafted, num_accepted + 1)):
            hit = 1.0 if i < num_accepted else 0.0
            old = self.rates[i]
            self.rates[i] = hit if old is None else self.decay * old + (1 - self.decay) * hit

    def observe_target(self, num_tokens: int, seconds: float) -> None:
        self.target.observe(num_tokens, seconds)

    def observe_draft(self, batch_size: int, passes: int, seconds: float) -> None:
        if passes > 0:
            self.draft.observe(batch_size, seconds / passes)

    # ---- the choice ------------------------------------------------------------------------

    def expected_tokens(self, k: int) -> float:
        total, p = 1.0, 1.0
        for i in range(k):
            r = self.rates[i]
            p *= 0.0 if r is None else r
            total += p
        return total

    def cost(self, k: int, batch_size: int) -> float:
        c = self.target(batch_size * (k + 1))
        return c + k * self.draft(batch_size) if k > 0 else c

    def choose(self, batch_size: int) -> int:
        """k for the next step of a batch of `batch_size` sequences."""
        self.steps += 1
        if batch_size <= 0:
            return self.last_k
        if self.steps <= self.warmup_steps or not (self.target.ready and self.draft.ready) \
                or self.rates[0] is None:
            self.last_k = self.k_max  # measure everything first
            return self.last_k
        best = max(range(self.k_max + 1),
                   key=lambda k: self.expected_tokens(k) / self.cost(k, batch_size))
        if best == self.k_max:
            self._since_probe = 0
        elif best != self._settled:  # the choice moved by itself: probe soon again
            self._since_probe, self.probe_interval = 0, self.base_probe_interval
        else:
            self._since_probe += 1
            if self._since_probe >= self.probe_interval:
                self._since_probe = 0
                self.probe_interval = min(2 * self.probe_interval, self.max_probe_interval)
                self._settled = best
                self.last_k = best + 1
                return self.last_k
        self._settled = best
        self.last_k = best
        return best
