"""/metrics speaks vLLM's series: the queries of vLLM's Grafana dashboard, evaluated here on two
scrapes the way Prometheus would (increase = delta, rate = increase / time, histogram_quantile by linear
interpolation within the bucket), give sensible answers, and the text parses with the official
Prometheus client's parser."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from entrypoints.server_helpers import ServerProcess, client_for

MODEL = "tiny-spec"


def scrape(srv: ServerProcess) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value}, through prometheus_client's parser."""
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def select(samples: dict, name: str, **match: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in samples.items()
            if n == name and all(dict(labels).get(k) == want for k, want in match.items())}


def increase(before: dict, after: dict, name: str, **match: str) -> float:
    """sum(increase(name{match}[window])); rate() is this over the window's seconds."""
    a, b = select(after, name, **match), select(before, name, **match)
    return sum(v - b.get(labels, 0.0) for labels, v in a.items())


def histogram_quantile(q: float, before: dict, after: dict, name: str, **match: str) -> float:
    """histogram_quantile(q, sum by (le) (rate(name_bucket{match}[window])))."""
    by_le: dict[float, float] = defaultdict(float)
    for labels, v in select(after, name + "_bucket", **match).items():
        le = dict(labels)["le"]
        by_le[float("inf") if le == "+Inf" else float(le)] += \
            v - select(before, name + "_bucket", **match).get(labels, 0.0)
    bounds = sorted(by_le)
    total = by_le[bounds[-1]]
    assert total > 0, f"no observations of {name}"
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound in bounds:
        if by_le[bound] >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (
                by_le[bound] - prev_count)
        prev_bound, prev_count = bound, by_le[bound]
    return bounds[-2]


def test_vllm_dashboard_queries_answer(spec_server: ServerProcess) -> None:
    oa: openai.OpenAI = client_for(spec_server)
    before, t0 = scrape(spec_server), time.monotonic()
    for i in range(3):
        oa.completions.create(model=MODEL, prompt=f"Count {i}", max_tokens=12, temperature=0,
                              extra_body={"ignore_eos": True})
    list(oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=12, stream=True, temperature=0,
                                    extra_body={"ignore_eos": True}))
    after, seconds = scrape(spec_server), time.monotonic() - t0
    m = {"model_name": MODEL, "engine": "0"}

    assert increase(before, after, "vllm:generation_tokens_total", **m) == 4 * 12
    assert increase(before, after, "vllm:prompt_tokens_total", **m) / seconds > 0  # rate()
    finished = increase(before, after, "vllm:request_success_total", **m)
    length = increase(before, after, "vllm:request_success_total", finished_reason="length", **m)
    assert finished == length == 4
    p99_ttft = histogram_quantile(0.99, before, after, "vllm:time_to_first_token_seconds", **m)
    p50_itl = histogram_quantile(0.5, before, after, "vllm:inter_token_latency_seconds", **m)
    p99_e2e = histogram_quantile(0.99, before, after, "vllm:e2e_request_latency_seconds", **m)
    assert 0 < p99_ttft <= p99_e2e < seconds + 1 and 0 < p50_itl < seconds
    queue = select(after, "vllm:request_queue_time_seconds_count", **m)
    assert sum(queue.values()) >= 4
    drafted = increase(before, after, "vllm:spec_decode_num_draft_tokens_total", **m)
    accepted = increase(before, after, "vllm:spec_decode_num_accepted_tokens_total", **m)
    assert drafted > 0 and accepted / drafted > 0.9  # the self-draft agrees with itself
    per_pos = select(after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", **m)
    assert sorted(dict(labels)["position"] for labels in per_pos) == ["0", "1", "2"]
    assert select(after, "vllm:num_requests_running", **m)
    assert 0 <= sum(select(after, "vllm:kv_cache_usage_perc", **m).values()) <= 1
    # ours beside them, with the same numbers
    assert sum(select(after, "tandem:generation_tokens_total").values()) == \
        sum(select(after, "vllm:generation_tokens_total").values())
