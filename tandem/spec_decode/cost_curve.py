"""The cost curve adaptive speculation prices k with (adaptive.py): seconds against the size of
a forward (tokens in a target pass, or a draft pass's batch), from recent timings."""

from __future__ import annotations

from collections import deque


class CostCurve:
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
