"""The cost curve adaptive speculation prices k with (adaptive.py): seconds against the size of
a forward (tokens in a target pass, or a draft pass's batch), from recent timings."""

from __future__ import annotations

from collections import Counter, deque
from typing import Iterable, Optional


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
    line.

    Why by batch (`batch`: the sequences in the step; 0 where it is not told). A step's cost is
    not a function of its tokens alone: each sequence's attention reads its whole context, so
    16 requests at a depth of 700 took 18 ms for their 16 tokens where the load-time
    calibration (one sequence, a short text) took 2.6-5.8 ms for 1-9 tokens, 0.4 ms a token
    more. One line through both made each verified token cost 1.6 ms at that batch, and
    adaptive k never drafted there (a lookup that gives 1.36x plain at fixed k: 0.96-1.05x). So
    the slope is the cost of a token within a batch (each batch's times at every size it was
    timed at, about their own mean, then pooled: what verifying one more token costs; the
    window of sizes near [lo, hi] left a batch of 16 two calibration sizes, 8 and 9, whose
    noise made a token 1.8 ms for 0.7), and the intercept is the priced batch's own (its times
    near [lo, hi], or the nearest batch size timed, less the slope's part): a batch pays its
    context once, whatever its drafts."""

    def __init__(self, window: int = 5, max_groups: int = 128, prior_weight: float = 1.0
                 ) -> None:
        self.window = window
        self.max_groups = max_groups
        self.prior_weight = prior_weight
        # (batch, size) -> its last `window` times (s)
        self.groups: dict[tuple[int, int], deque[float]] = {}
        # (batch, size) -> _kept of its times, kept up to date by observe: a step's choice fits
        # every group, and summing each group's times anew took 40% of a lookup's choice
        self.kept: dict[tuple[int, int], tuple[float, float]] = {}
        self.batches: Counter[int] = Counter()  # batch -> its groups

    def observe(self, size: int, seconds: float, batch: int = 0) -> None:
        key = (batch, size)
        if key not in self.groups:
            self.groups[key] = deque(maxlen=self.window)
            self.batches[batch] += 1
        self.groups[key].append(seconds)
        self.kept[key] = self._kept(self.groups[key])
        if len(self.groups) > self.max_groups:  # forget the group with the least evidence
            gone = min((g for g in self.groups if g != key), key=lambda g: len(self.groups[g]))
            del self.groups[gone], self.kept[gone]
            self.batches[gone[0]] -= 1
            if not self.batches[gone[0]]:
                del self.batches[gone[0]]

    @property
    def sizes(self) -> dict[int, list[float]]:
        """Each size timed, with its times (of every batch)."""
        out: dict[int, list[float]] = {}
        for (_, size), times in sorted(self.groups.items(), key=lambda kv: kv[0][1]):
            out.setdefault(size, []).extend(times)
        return out

    @staticmethod
    def _kept(times: Iterable[float]) -> tuple[float, float]:
        """(sum, count) of `times` within twice the least of them."""
        times = list(times)
        if not times:
            return 0.0, 0.0
        kept = [t for t in times if t <= 2 * min(times)]
        return sum(kept), float(len(kept))

    def _means(self, batch: Optional[int]) -> dict[tuple[int, int], tuple[float, float]]:
        """(sum, count) per group; batch None: the groups of a size taken as one (batch 0)."""
        if batch is not None:
            return self.kept
        return {(0, size): self._kept(t) for size, t in self.sizes.items()}

    def _anchor(self, batch: int) -> int:
        """The batch size whose times give the intercept: `batch`, else the nearest timed."""
        if batch in self.batches:
            return batch
        return min(self.batches, key=lambda b: (abs(b - batch), -b))

    @property
    def ready(self) -> bool:
        return bool(self.groups)

    def fit(self, lo: float, hi: float, batch: Optional[int] = None) -> tuple[float, float]:
        """(a, b): seconds ~ a + b * size around [lo, hi], for a step of `batch` sequences (None:
        every batch's times as one)."""
        means = self._means(batch)
        near = [g for g in means if lo / 2 <= g[1] <= 2 * hi]
        used = near if len({g[1] for g in near}) >= 2 else list(means)
        if batch is None:
            return self._fit_pooled([means[g] + (g[1],) for g in used])
        # Each batch's times about its own mean (x: the size, y: the mean time), every size of
        # each, then pooled.
        by_batch: dict[int, list[tuple[float, float, float]]] = {}
        for g in means:
            total, count = means[g]
            by_batch.setdefault(g[0], []).append((count, float(g[1]), total / count))
        cov = var = scale = 0.0
        for rows in by_batch.values():
            n = sum(w for w, _, _ in rows)
            mx, my = sum(w * x for w, x, _ in rows) / n, sum(w * y for w, _, y in rows) / n
            cov += sum(w * (x - mx) * (y - my) for w, x, y in rows)
            var += sum(w * (x - mx) ** 2 for w, x, _ in rows)
            scale = max(scale, mx * mx)
        if var <= 1e-12 * max(1.0, scale):
            # no batch timed at two sizes: every batch's times as one
            return self._fit_pooled([means[g] + (g[1],) for g in used])
        slope = max(0.0, cov / var)
        anchor = self._anchor(batch)
        own = [g for g in means if g[0] == anchor]
        own = [g for g in own if g in used] or own
        w = sum(means[g][1] for g in own)
        a = sum(means[g][0] - means[g][1] * slope * g[1] for g in own) / w
        return max(0.0, a), slope

    @staticmethod
    def _fit_pooled(rows: list[tuple[float, float, int]]) -> tuple[float, float]:
        """A least-squares line through (total, count, size) means, each weighted by count."""
        w = [count for _, count, _ in rows]
        x = [float(size) for _, _, size in rows]
        y = [total / count for total, count, _ in rows]
        n = sum(w)
        mean_x = sum(wi * xi for wi, xi in zip(w, x)) / n
        mean_y = sum(wi * yi for wi, yi in zip(w, y)) / n
        var = sum(wi * (xi - mean_x) ** 2 for wi, xi in zip(w, x))
        if var <= 1e-12 * max(1.0, mean_x * mean_x):  # one size seen: proportional
            return 0.0, mean_y / mean_x
        slope = max(0.0, sum(wi * (xi - mean_x) * (yi - mean_y)
                             for wi, xi, yi in zip(w, x, y)) / var)
        return max(0.0, mean_y - slope * mean_x), slope

    def at(self, size: int, line: tuple[float, float], batch: Optional[int] = None) -> float:
        """The cost of `size` (in a step of `batch` sequences, as `line` was fitted): its mean,
        shrunk towards `line` (a, b) from `fit`."""
        if batch is None:
            total, weight = self._kept(self.sizes.get(size, ()))
        else:
            total, weight = self.kept.get((self._anchor(batch), size), (0.0, 0.0))
        prior = max(1e-6, line[0] + line[1] * size)
        return (total + self.prior_weight * prior) / (weight + self.prior_weight)

    def __call__(self, size: int, batch: Optional[int] = None) -> float:
        return self.at(size, self.fit(size, size, batch), batch)
