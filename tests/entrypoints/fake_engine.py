"""A stand-in for LLMEngine with the same interface, for testing the server's plumbing in-process:
deterministic pseudo-logits per context, cumulative outputs, n choices, logprobs, stop strings,
KV-block accounting and injectable step failures. It knows nothing about models."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional, Union

from tandem.metrics import Metric
from tandem.outputs import CompletionOutput, Logprob, RequestOutput, SpecDecodeRequestStats
from tandem.engine.request_checks import check_logprobs
from tandem.sampling_params import SamplingParams

FIRST_REGULAR_ID = 3  # ids below are special tokens in the tiny byte-level tokenizer


@dataclass
class _Choice:
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    stats: Optional[SpecDecodeRequestStats] = None


@dataclass
class _Req:
    rid: str
    prompt: Optional[str]
    ids: list[int]
    params: SamplingParams
    choices: list[_Choice]
    rng: random.Random
    blocks: int
    final_only: bool = False


class FakeEngine:
    def __init__(self, tokenizer: Any, max_model_len: int = 128, num_blocks: int = 256,
                 block_size: int = 16, spec_k: int = 0) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.model_config = SimpleNamespace(max_model_len=max_model_len,
                                            vocab_size=self.vocab_size)
        self.num_blocks, self.block_size, self.spec_k = num_blocks, block_size, spec_k
        self.free_blocks = num_blocks
        self.requests: dict[str, _Req] = {}
        self.fail_next_step = False
        self.step_delay = 0.0  # seconds per step, to keep requests in flight for abort tests
        self.steps = 0
        self.accepted = 0
        self.drafted = 0

    def _logprobs(self, context: list[int]) -> list[float]:
        rng = random.Random(hash(tuple(context[-4:])) & 0xFFFFFFFF)
        logits = [rng.gauss(0, 3) if i >= FIRST_REGULAR_ID else -1e9
                  for i in range(self.vocab_size)]
        top = max(logits)
        norm = top + math.log(sum(math.exp(x - top) for x in logits))
        return [x - norm for x in logits]

    def add_request(self, request_id: str, prompt: Union[str, list[int]],
                    params: SamplingParams, final_only: bool = False) -> None:
        ids = list(self.tokenizer(prompt).input_ids) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("The prompt is empty.")
        if any(t < 0 or t >= self.vocab_size for t in ids):
            raise ValueError("Token id out of vocabulary.")
        if len(ids) > self.model_config.max_model_len:
            raise ValueError(f"prompt length {len(ids)} > {self.model_config.max_model_len}")
        check_logprobs(params, 20, self.vocab_size)  # the engine's --max-logprobs default
        blocks = -(-len(ids) // self.block_size) * params.n
        self.free_blocks -= blocks
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        choices = [_Choice(i, stats=SpecDecodeRequestStats() if self.spec_k else None)
                   for i in range(params.n)]
        self.requests[request_id] = _Req(request_id, prompt if isinstance(prompt, str) else None,
                                         ids, params, choices, random.Random(seed), blocks,
                                         final_only)

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.free_blocks += req.blocks

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def num_free_kv_blocks(self) -> int:
        return self.free_blocks

    def get_metrics(self) -> list[Metric]:
        return [Metric("tandem:spec_decode_num_accepted_tokens", self.accepted),
                Metric("tandem:spec_decode_num_draft_tokens", self.drafted),
                Metric("tandem:kv_cache_free_blocks", self.free_blocks, kind="gauge")]

    def _next(self, req: _Req, c: _Choice) -> None:
        context = req.ids + c.token_ids
        lps = self._logprobs(context + [c.index if req.params.temperature > 0 else 0])
        if req.params.temperature == 0:
            token = max(range(self.vocab_size), key=lambda i: lps[i])
        else:
            token = req.rng.choices(range(self.vocab_size), [math.exp(x) for x in lps])[0]
        c.token_ids.append(token)
        if req.params.logprobs is not None:
            ranked = sorted(range(self.vocab_size), key=lambda i: -lps[i])
            entry = {t: Logprob(lps[t], r + 1, self.tokenizer.decode([t]))
                     for r, t in enumerate(ranked[:req.params.logprobs])}
            entry.setdefault(token, Logprob(lps[token], ranked.index(token) + 1,
                                            self.tokenizer.decode([token])))
            c.logprobs.append(entry)
        c.text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        for stop in req.params.stop:
            pos = c.text.find(stop)
            if pos >= 0:
                c.text, c.finish_reason, c.stop_reason = c.text[:pos], "stop", stop
                return
        if len(c.token_ids) >= req.params.max_tokens:
            c.finish_reason = "length"

    def step(self) -> list[RequestOutput]:
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("injected step failure")
        time.sleep(self.step_delay)
        self.steps += 1
        outputs = []
        for req in list(self.requests.values()):
            for c in req.choices:
                burst = 1 + (min(2, self.spec_k) if self.spec_k else 0)
                for _ in range(burst):
                    if c.finish_reason is None:
                        self._next(req, c)
                if c.stats is not None:
                    c.stats.record(self.spec_k, burst - 1, self.spec_k)
                    self.accepted += burst - 1
                    self.drafted += self.spec_k
            finished = all(c.finish_reason for c in req.choices)
            if req.final_only and not finished:
                continue
            outs = [CompletionOutput(c.index, c.text, list(c.token_ids), None,
                                     list(c.logprobs) if req.params.logprobs is not None
                                     else None, c.finish_reason, c.stop_reason, c.stats)
                    for c in req.choices]
            prompt_lps = None
            if req.params.prompt_logprobs is not None:
                prompt_lps = [None] + [{t: Logprob(-1.0, 1, self.tokenizer.decode([t]))}
                                       for t in req.ids[1:]]
            outputs.append(RequestOutput(req.rid, req.prompt, req.ids, prompt_lps, outs,
                                         finished))
            if finished:
                self.abort_request(req.rid)
        return outputs
