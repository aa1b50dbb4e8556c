"""vLLM's per-request latency histograms and finished-request counters.

Each sequence carries its timestamps (arrival, first scheduled, first and last token); the
engine reports once a step which sequences were scheduled, which produced tokens and which
finished. Inter-token latency is observed once per step that produced tokens for a sequence (as
vLLM does: a verify step that accepts several drafts is one observation), so speculation shows
up as fewer, not shorter, gaps. Times come from time.monotonic().
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

from tandem.core.request import Request, RequestStatus
from tandem.metrics import (PREFIX, VLLM_LABELS, VLLM_PREFIX, AnyMetric,
                            HistogramAccumulator, Metric)

# vLLM's bucket bounds (seconds).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISHED_REASONS = ("stop", "length", "abort", "error")


def token_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to the context length (vLLM's build_1_2_5_buckets)."""
    out, base = [], 1
    while True:
        for m in (1, 2, 5):
            if m * base > max_model_len:
                return out
            out.append(float(m * base))
        base *= 10


class LatencyMetrics:
    def __init__(self, max_model_len: int) -> None:
        def h(name: str, buckets: list[float]) -> HistogramAccumulator:
            return HistogramAccumulator(PREFIX + name, buckets)
        self.ttft = h("time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", REQUEST_BUCKETS)
        self.queue = h("request_queue_time_seconds", REQUEST_BUCKETS)
        self.prefill = h("request_prefill_time_seconds", REQUEST_BUCKETS)
        self.decode = h("request_decode_time_seconds", REQUEST_BUCKETS)
        self.inference = h("request_inference_time_seconds", REQUEST_BUCKETS)
        self.prompt_tokens = h("request_prompt_tokens", token_buckets(max_model_len))
        self.generation_tokens = h("request_generation_tokens", token_buckets(max_model_len))
        self.finished = {reason: 0 for reason in FINISHED_REASONS}

    def on_step(self, scheduled: Iterable[Request], progressed: Iterable[Request],
                now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        for req in scheduled:
            if req.scheduled_time is None:
                req.scheduled_time = now
                self.queue.observe(now - req.arrival_time)
        for req in progressed:
            if req.first_token_time is None:
                req.first_token_time = now
                self.ttft.observe(now - req.arrival_time)
            elif req.last_token_time is not None:
                self.itl.observe(now - req.last_token_time)
            req.last_token_time = now
            if req.status.finished:
                self.on_finished(req, now)

    def on_finished(self, req: Request, now: Optional[float] = None) -> None:
        """Once per sequence, when it finishes (also aborted or failed ones)."""
        now = time.monotonic() if now is None else now
        reason = req.status.value if req.status is not RequestStatus.FINISHED_LENGTH else "length"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.e2e.observe(now - req.arrival_time)
        self.prompt_tokens.observe(req.num_prompt_tokens)
        self.generation_tokens.observe(len(req.output_token_ids))
        if req.scheduled_time is not None:
            self.inference.observe(now - req.scheduled_time)
            if req.first_token_time is not None:
                self.prefill.observe(req.first_token_time - req.scheduled_time)
                self.decode.observe(now - req.first_token_time)

    def metrics(self) -> list[AnyMetric]:
        out: list[AnyMetric] = [a.snapshot() for a in (
            self.ttft, self.itl, self.e2e, self.queue, self.prefill, self.decode, self.inference,
            self.prompt_tokens, self.generation_tokens)]
        # vLLM counts finished requests by reason in one labelled series.
        out += [Metric(VLLM_PREFIX + "request_success", n,
                       {"finished_reason": reason, **VLLM_LABELS})
                for reason, n in self.finished.items()]
        return out
