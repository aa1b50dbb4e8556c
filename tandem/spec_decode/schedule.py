"""vLLM's dynamic speculative decoding: `num_speculative_tokens_per_batch_size`.

A list of [start, end, k] with inclusive batch-size ranges: while `start <= batch size <= end`
requests are running, at most k drafts per request (k = 0: plain decoding). Validated as vLLM
does (positive bounds, start <= end, k >= 0, ranges sorted by start must not overlap, the first
must start at 1); gaps and the tail past the last range carry the previous range's k forward, as
vLLM's lookup does. Where vLLM silently clamps a k above num_speculative_tokens, tandem refuses it:
num_speculative_tokens is the upper bound, and a schedule asking for more is a mistake.

With adaptive speculation the schedule is a cap: the controller chooses 0..cap at each step.
"""

from __future__ import annotations

_FIELD = "speculative_config['num_speculative_tokens_per_batch_size']"


def validate_schedule(raw: object, num_speculative_tokens: int) -> list[tuple[int, int, int]]:
    """The ranges sorted by start, or ValueError naming the field and what is allowed."""
    shape = "a non-empty list of [range_start, range_end, num_speculative_tokens] entries"
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{_FIELD} must be {shape}, got {raw!r}.")
    ranges: list[tuple[int, int, int]] = []
    for entry in raw:
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
            raise ValueError(f"{_FIELD}: each entry must be 3 integers [range_start, range_end, "
                             f"num_speculative_tokens], got {entry!r}.")
        start, end, k = entry
        if start <= 0 or end <= 0:
            raise ValueError(f"{_FIELD}: batch-size range ({start}, {end}) must be positive.")
        if start > end:
            raise ValueError(f"{_FIELD}: batch-size range start must be <= end for "
                             f"({start}, {end}, {k}).")
        if k < 0:
            raise ValueError(f"{_FIELD}: num_speculative_tokens values must be >= 0, got {k} "
                             f"in {list(entry)}.")
        if k > num_speculative_tokens:
            raise ValueError(f"{_FIELD}: k={k} in {list(entry)} is above num_speculative_tokens="
                             f"{num_speculative_tokens}, the upper bound of every step's drafts.")
        ranges.append((start, end, k))
    ranges.sort(key=lambda r: r[0])
    previous_end = 0
    for start, end, _ in ranges:
        if start <= previous_end:
            raise ValueError(f"{_FIELD}: batch-size ranges must not overlap (ranges are "
                             f"inclusive), got {[list(r) for r in ranges]}.")
        previous_end = end
    if ranges[0][0] != 1:
        raise ValueError(f"{_FIELD}: the first batch-size range must start at 1 so every batch "
                         f"size has a defined k, got {[list(r) for r in ranges]}.")
    return ranges


class BatchSizeSchedule:
    def __init__(self, raw: object, num_speculative_tokens: int) -> None:
        self.ranges = validate_schedule(raw, num_speculative_tokens)

    def cap(self, batch_size: int) -> int:
        """k for this many running requests: its range's, or the last range's before it."""
        k = self.ranges[0][2]
        for start, end, range_k in self.ranges:
            if batch_size < start:
                break
            k = range_k
        return k
