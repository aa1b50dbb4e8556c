"""vLLM's latency histograms and finished-request counters: the arithmetic on given timestamps,
and the engine's series under both prefixes."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.core.request import Request, RequestStatus
from tandem.engine.latency_metrics import LatencyMetrics, token_buckets
from tandem.metrics import Histogram, to_prometheus
from tandem.sample.random import SeededRandom


def _request(arrival: float) -> Request:
    return Request("r", [1, 2, 3], SamplingParams(max_tokens=4), SeededRandom(0),
                   arrival_time=arrival)


def _hist(metrics, name: str) -> Histogram:
    return next(m for m in metrics if m.name == name)


def test_timestamps_become_queue_ttft_itl_and_request_times() -> None:
    lat = LatencyMetrics(max_model_len=256)
    req = _request(arrival=10.0)
    lat.on_step([req], [], now=10.5)                 # scheduled: 0.5 s in the queue
    lat.on_step([req], [req], now=11.0)              # first token: TTFT 1.0 s, prefill 0.5 s
    lat.on_step([req], [req], now=11.02)             # ITL 0.02 s
    req.output_token_ids = [5, 6, 7]
    req.status = RequestStatus.FINISHED_LENGTH
    lat.on_step([req], [req], now=11.25)             # ITL 0.23 s; finished
    m = lat.metrics()
    queue = _hist(m, "tandem:request_queue_time_seconds")
    assert queue.count == 1 and queue.sum == pytest.approx(0.5)
    assert queue.counts[queue.buckets.index(0.5)] == 1  # le="0.5" holds exactly 0.5
    ttft = _hist(m, "tandem:time_to_first_token_seconds")
    assert ttft.count == 1 and ttft.sum == pytest.approx(1.0)
    itl = _hist(m, "tandem:inter_token_latency_seconds")
    assert itl.count == 2 and itl.sum == pytest.approx(0.25)
    assert itl.counts[itl.buckets.index(0.025)] == 1 and itl.counts[itl.buckets.index(0.3)] == 1
    assert _hist(m, "tandem:e2e_request_latency_seconds").sum == pytest.approx(1.25)
    assert _hist(m, "tandem:request_prefill_time_seconds").sum == pytest.approx(0.5)
    assert _hist(m, "tandem:request_decode_time_seconds").sum == pytest.approx(0.25)
    assert _hist(m, "tandem:request_inference_time_seconds").sum == pytest.approx(0.75)
    assert _hist(m, "tandem:request_generation_tokens").sum == 3
    success = {x.labels["finished_reason"]: x.value for x in m
               if x.name == "vllm:request_success"}
    assert success == {"stop": 0, "length": 1, "abort": 0, "error": 0}


def test_a_request_aborted_in_the_queue_counts_as_abort_without_ttft() -> None:
    lat = LatencyMetrics(max_model_len=64)
    req = _request(arrival=0.0)
    req.status = RequestStatus.FINISHED_ABORTED
    lat.on_finished(req, now=2.0)
    m = lat.metrics()
    assert _hist(m, "tandem:time_to_first_token_seconds").count == 0
    assert _hist(m, "tandem:e2e_request_latency_seconds").sum == pytest.approx(2.0)
    assert _hist(m, "tandem:request_inference_time_seconds").count == 0
    assert [x.value for x in m if x.name == "vllm:request_success"
            and x.labels["finished_reason"] == "abort"] == [1]


def test_token_buckets_are_1_2_5_up_to_the_context() -> None:
    assert token_buckets(256) == [1, 2, 5, 10, 20, 50, 100, 200]
    assert token_buckets(1) == [1]


def test_prometheus_histogram_is_cumulative_with_inf_sum_and_count() -> None:
    h = Histogram("vllm:x_seconds", (0.1, 1.0), (2, 0, 1), 3.5, {"engine": "0"})
    lines = to_prometheus([h], "m").splitlines()
    assert lines == ["# TYPE vllm:x_seconds histogram",
                     'vllm:x_seconds_bucket{model_name="m",engine="0",le="0.1"} 2',
                     'vllm:x_seconds_bucket{model_name="m",engine="0",le="1.0"} 2',
                     'vllm:x_seconds_bucket{model_name="m",engine="0",le="+Inf"} 3',
                     'vllm:x_seconds_sum{model_name="m",engine="0"} 3.5',
                     'vllm:x_seconds_count{model_name="m",engine="0"} 3']


def test_engine_reports_vllm_names_beside_ours(tiny_llama: str) -> None:
    llm = LLM(model=tiny_llama, speculative_config={"model": tiny_llama, "method": "draft_model",
                                                    "num_speculative_tokens": 3, "adaptive": False})
    llm.generate(["a b c", "hello there"], SamplingParams(max_tokens=9, temperature=0,
                                                          ignore_eos=True, n=2), use_tqdm=False)
    by_name = {(m.name, tuple(sorted(m.labels.items()))): m for m in llm.get_metrics()}
    names = {name for name, _ in by_name}
    for base in ("prompt_tokens", "generation_tokens", "num_requests_running",
                 "kv_cache_usage_perc", "spec_decode_num_drafts",
                 "spec_decode_num_accepted_tokens_per_pos", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds"):
        assert "tandem:" + base in names and "vllm:" + base in names, base
    ours = next(m for (n, _), m in by_name.items() if n == "tandem:generation_tokens")
    theirs = next(m for (n, _), m in by_name.items() if n == "vllm:generation_tokens")
    assert theirs.value == ours.value == 4 * 9 and theirs.labels == {"engine": "0"}
    ttft = next(m for (n, _), m in by_name.items() if n == "vllm:time_to_first_token_seconds")
    assert ttft.count == 4                      # one per sequence (n=2 for 2 prompts)
    e2e = next(m for (n, _), m in by_name.items() if n == "vllm:e2e_request_latency_seconds")
    assert e2e.count == 4 and e2e.sum >= ttft.sum
    itl = next(m for (n, _), m in by_name.items() if n == "vllm:inter_token_latency_seconds")
    # One observation per step that produced tokens: fewer than the 8 gaps per sequence, since
    # a self-draft gets several tokens per verify step.
    assert 0 < itl.count < 4 * 8
    length = by_name[("vllm:request_success", (("engine", "0"), ("finished_reason", "length")))]
    assert length.value == 4
