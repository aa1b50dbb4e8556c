"""Named engine metrics, readable through `llm.get_metrics()` and exported as Prometheus text.

Counters are plain integers owned by the engine; `Metric`, `Vector` and `Histogram` are the
read-only snapshots handed out. Every series exists under our prefix (`tandem:`) and, where vLLM
has the same series, under vLLM's name too (`vllm:`, with its `engine` label), so dashboards and
alerts written for vLLM work unchanged.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Union

PREFIX = "tandem:"
VLLM_PREFIX = "vllm:"
# Series that vLLM exports under the same name and meaning (after the prefix).
VLLM_SHARED = frozenset({
    "prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries",
    "prefix_cache_hits", "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
    "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens"})
VLLM_LABELS = {"engine": "0"}


@dataclass(frozen=True)
class Metric:
    name: str
    value: Union[int, float]
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "counter"  # "counter" | "gauge"


@dataclass(frozen=True)
class Vector:
    """A counter with one value per position (vLLM's per-position accepted tokens)."""
    name: str
    values: list[int]
    label: str = "position"
    kind: str = "counter"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Histogram:
    """Observations counted per bucket: `counts[i]` fall at or below `buckets[i]` and above the
    bucket before (the last count is above every bound, Prometheus' +Inf)."""
    name: str
    buckets: tuple[float, ...]
    counts: tuple[int, ...]     # len(buckets) + 1, not cumulative
    sum: float
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "histogram"

    @property
    def count(self) -> int:
        return sum(self.counts)


AnyMetric = Union[Metric, Vector, Histogram]


class HistogramAccumulator:
    def __init__(self, name: str, buckets: list[float]) -> None:
        self.name = name
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def snapshot(self) -> Histogram:
        return Histogram(self.name, self.buckets, tuple(self.counts), self.sum)


def with_vllm_names(metrics: list[AnyMetric]) -> list[AnyMetric]:
    """The metrics, plus a `vllm:` copy (with the `engine` label) of each series vLLM has."""
    copies: list[AnyMetric] = []
    for m in metrics:
        if m.name.startswith(PREFIX) and m.name[len(PREFIX):] in VLLM_SHARED:
            copies.append(replace(m, name=VLLM_PREFIX + m.name[len(PREFIX):],
                                  labels={**m.labels, **VLLM_LABELS}))
    return metrics + copies


def _labels(model_name: str, labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in {"model_name": model_name, **labels}.items())


def _le(bound: float) -> str:
    return repr(float(bound))


def to_prometheus(metrics: list[AnyMetric], model_name: str) -> str:
    """Prometheus text exposition; counters get the conventional `_total` suffix."""
    lines: list[str] = []
    typed: set[str] = set()  # one TYPE line per family (a family may have several label sets)
    for m in metrics:
        prom = m.name  # colons are legal in Prometheus metric names
        if isinstance(m, Histogram):
            lines.append(f"# TYPE {prom} histogram")
            cumulative = 0
            for bound, c in zip(m.buckets + (float("inf"),), m.counts):
                cumulative += c
                le = "+Inf" if bound == float("inf") else _le(bound)
                lines.append(f'{prom}_bucket{{{_labels(model_name, {**m.labels, "le": le})}}} '
                             f'{cumulative}')
            lines.append(f"{prom}_sum{{{_labels(model_name, m.labels)}}} {m.sum}")
            lines.append(f"{prom}_count{{{_labels(model_name, m.labels)}}} {cumulative}")
            continue
        suffix = "_total" if m.kind == "counter" else ""
        if prom + suffix not in typed:
            typed.add(prom + suffix)
            lines.append(f"# TYPE {prom}{suffix} {m.kind}")
        if isinstance(m, Vector):
            for i, v in enumerate(m.values):
                lines.append(f"{prom}{suffix}{{{_labels(model_name, {**m.labels, m.label: str(i)})}}}"
                             f" {v}")
        else:
            lines.append(f"{prom}{suffix}{{{_labels(model_name, m.labels)}}} {m.value}")
    return "\n".join(lines) + "\n"
