"""The engine's counters, gauges and histograms as named metrics (ours, and vLLM's names)."""

from __future__ import annotations

from typing import Optional, Sequence

from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.scheduler import Scheduler
from tandem.engine.latency_metrics import LatencyMetrics
from tandem.metrics import PREFIX, AnyMetric, Metric
from tandem.spec_decode.metrics import SpecDecodeMetrics


def engine_metrics(counters: dict[str, int], kv: KVCacheManager, sched: Scheduler,
                   num_blocks: int, spec_metrics: Optional[SpecDecodeMetrics],
                   latency: LatencyMetrics) -> list[AnyMetric]:
    """The engine's parts' numbers (passed in, so this module sits below the engine)."""
    c = counters
    used = num_blocks - kv.num_free_blocks
    metrics: list[AnyMetric] = [
        Metric(PREFIX + "prompt_tokens", c["prompt_tokens"]),
        Metric(PREFIX + "generation_tokens", c["generation_tokens"]),
        Metric(PREFIX + "request_success", c["request_success"]),
        Metric(PREFIX + "request_aborted", c["request_aborted"]),
        Metric(PREFIX + "request_failed", c["request_failed"]),
        Metric(PREFIX + "num_preemptions", sched.num_preemptions),
        Metric(PREFIX + "prefix_cache_queries", kv.prefix_queries),
        Metric(PREFIX + "prefix_cache_hits", kv.prefix_hits),
        Metric(PREFIX + "num_requests_running", len(sched.running), kind="gauge"),
        Metric(PREFIX + "num_requests_waiting", len(sched.waiting), kind="gauge"),
        Metric(PREFIX + "kv_cache_usage_perc", used / num_blocks, kind="gauge"),
        Metric(PREFIX + "kv_cache_free_blocks", kv.num_free_blocks, kind="gauge"),
    ]
    if spec_metrics is not None:
        metrics.extend(spec_metrics.metrics())
    metrics.extend(latency.metrics())
    # The vllm: copies are added where metrics are read (LLM.get_metrics, /metrics), not in the
    # snapshot the server's engine thread takes after every step.
    return metrics


def stats_line(metrics: Sequence[AnyMetric], running: int) -> str:
    """The periodic log line of a serving engine: requests in flight, draft acceptance."""
    values = {m.name: getattr(m, "value", None) for m in metrics}
    accepted = values.get(PREFIX + "spec_decode_num_accepted_tokens")
    drafted = values.get(PREFIX + "spec_decode_num_draft_tokens")
    spec = (f", draft acceptance {accepted / drafted:.1%}"
            if accepted is not None and drafted else "")
    return f"running requests: {running}{spec}"
