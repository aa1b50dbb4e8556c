"""LLMEngine: owns the models, the KV cache, the scheduler and the step loop.

One `step()` = schedule -> target forward + (rejection) sampling -> append tokens and check stops
-> draft proposals for the next step -> RequestOutputs for the requests that progressed.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Optional, Union

import torch

from tandem.config import EngineConfig, ModelConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.request import Request, RequestStatus
from tandem.core.scheduler import Scheduler
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.request_group import RequestGroup
from tandem.engine.stop_checker import check_stop
from tandem.loader.tokenizer import load_tokenizer
from tandem.loader.weights import iter_weights
from tandem.metrics import PREFIX, Metric, Vector
from tandem.models.registry import build_model
from tandem.outputs import RequestOutput, SpecDecodeRequestStats
from tandem.sampling_params import SamplingParams
from tandem.spec_decode.metrics import SpecDecodeMetrics
from tandem.spec_decode.factory import build_proposer
from tandem.spec_decode.proposer import DraftProposer
from tandem.worker.kv_cache import allocate_kv_caches, determine_num_blocks
from tandem.worker.model_runner import ModelRunner, RunnerOutput

logger = logging.getLogger("tandem")


def _load(mc: ModelConfig, device: torch.device) -> torch.nn.Module:
    try:
        return build_model(mc.hf_config, mc.dtype, device,
                           iter_weights(mc.model_dir, mc.gguf_file, mc.hf_config))
    except torch.OutOfMemoryError as e:
        raise ValueError(f"{mc.model} does not fit in {device} memory in {mc.dtype} ({e}). Use a "
                         "smaller model or dtype, or free memory on the device.") from e


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        mc = config.model_config
        self.model_config = mc
        self.device = config.device
        self.tokenizer = load_tokenizer(mc)
        t0 = time.perf_counter()
        self.model = _load(mc, self.device)
        logger.info("Loaded %s (%s) in %.1f s", mc.model, mc.architecture, time.perf_counter() - t0)
        spec = config.speculative_config
        self.draft_model = None
        if spec is not None:
            dc = spec.draft_model_config
            logger.info("Loading drafter model %s ...", dc.model)
            self.draft_model = _load(dc, self.device)
        models = [m for m in (self.model, self.draft_model) if m is not None]
        cache, sched = config.cache_config, config.scheduler_config
        self.num_blocks = determine_num_blocks(models, cache, mc.dtype, self.device,
                                               mc.max_model_len, sched.max_num_seqs,
                                               sched.num_lookahead_tokens)
        for m in models:
            allocate_kv_caches(m, self.num_blocks, cache.block_size, mc.dtype, self.device)
        self.kv = KVCacheManager(self.num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.scheduler = Scheduler(sched, self.kv)
        self.runner = ModelRunner(self.model, cache.block_size, self.device, mc.vocab_size,
                                  self.tokenizer)
        self.proposer: Optional[DraftProposer] = None
        self.spec_metrics: Optional[SpecDecodeMetrics] = None
        if spec is not None:
            self.proposer = build_proposer(config, self.draft_model, self.kv, self.device)
            self.spec_metrics = SpecDecodeMetrics(spec.num_speculative_tokens)
        self._rng = random.Random(mc.seed)
        self.parents: dict[str, RequestGroup] = {}
        self._child_parent: dict[str, RequestGroup] = {}
        self.eos_token_id = self.tokenizer.eos_token_id
        self._extra_stop_ids = self._config_eos_ids() - {self.eos_token_id}
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "request_success": 0,
                         "request_aborted": 0}

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> LLMEngine:
        return cls(EngineConfig.create(model=model, **kwargs))

    def _config_eos_ids(self) -> set[int]:
        eos = getattr(self.model_config.hf_config, "eos_token_id", None)
        ids = eos if isinstance(eos, (list, tuple)) else [eos]
        return {int(i) for i in ids if i is not None}

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Union[str, list[int]],
                    params: Optional[SamplingParams] = None, final_only: bool = False) -> None:
        """Queue a request. Outputs are cumulative; with `final_only` the engine returns one only
        when the request has finished (cheaper for large `n`)."""
        params = params.clone() if params is not None else SamplingParams()
        if request_id in self.parents:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        if isinstance(prompt, str):
            text: Optional[str] = prompt
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            text, ids = None, [int(t) for t in prompt]
        self._validate_prompt(ids)
        mc = self.model_config
        if params.max_tokens is None:
            params.max_tokens = max(1, mc.max_model_len - len(ids))
        params._all_stop_token_ids = set(params.stop_token_ids) | self._extra_stop_ids
        children = []
        for i in range(params.n):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = params.clone()
                child_params.seed = params.seed + i  # distinct, reproducible children
            children.append(Request(
                request_id=request_id if params.n == 1 else f"{i}_{request_id}",
                prompt_token_ids=ids, params=child_params, prompt=text,
                generator=self._generator(child_params.seed), eos_token_id=self.eos_token_id,
                parent_id=request_id, index=i,
                spec_stats=SpecDecodeRequestStats() if self.proposer else None))
        parent = RequestGroup(request_id, text, ids, children, final_only)
        for child in children:
            parent.detoks[child.request_id] = IncrementalDetokenizer(
                self.tokenizer, ids, params.stop, params.include_stop_str_in_output,
                params.skip_special_tokens)
            self._child_parent[child.request_id] = parent
            self.scheduler.add_request(child)
        self.parents[request_id] = parent
        self.counters["prompt_tokens"] += len(ids) * params.n

    def _validate_prompt(self, ids: list[int]) -> None:
        mc = self.model_config
        if not ids:
            raise ValueError("The decoder prompt cannot be empty.")
        bad = [t for t in ids if t < 0 or t >= mc.vocab_size]
        if bad:
            raise ValueError(f"Token id {bad[0]} is out of vocabulary (vocab size "
                             f"{mc.vocab_size}).")
        if len(ids) > mc.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {mc.max_model_len}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens.")
        bs = self.config.cache_config.block_size
        need = -(-(len(ids) + 1 + self.config.scheduler_config.num_lookahead_tokens) // bs)
        if need > self.num_blocks:
            raise ValueError(f"The prompt ({len(ids)} tokens) needs {need} KV blocks but the "
                             f"cache has only {self.num_blocks}; raise kv_cache_memory_bytes.")

    def _generator(self, seed: Optional[int]) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed if seed is not None else self._rng.getrandbits(63))
        return g

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        for child in parent.children:
            self._child_parent.pop(child.request_id, None)
            if not child.status.finished:
                self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
        self.counters["request_aborted"] += 1

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def num_free_kv_blocks(self) -> int:
        return self.kv.num_free_blocks

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if not sched:
            return []
        result = self.runner.execute(sched)
        self._record_spec(sched, result)
        for rid, plp in result.prompt_logprobs.items():
            req = self.scheduler.requests.get(rid)
            if req is not None:
                req.prompt_logprobs.extend(plp)
        progressed = self.scheduler.update_from_output(
            sched, result.sampled, self._check_stop,
            lambda req, j, tok: self._on_token(req, j, tok, result))
        if self.proposer is not None:
            self.proposer.propose(self.scheduler.running)
            if self.config.log_stats:
                self.spec_metrics.maybe_log()
        return self._make_outputs(progressed)

    def _record_spec(self, sched, result: RunnerOutput) -> None:
        if self.spec_metrics is None:
            return
        k = self.config.speculative_config.num_speculative_tokens
        for s in sched.scheduled:
            if s.spec_token_ids and s.request.request_id in result.sampled:
                accepted = len(result.sampled[s.request.request_id]) - 1
                self.spec_metrics.observe(len(s.spec_token_ids), accepted)
                s.request.spec_stats.record(len(s.spec_token_ids), accepted, k)

    def _on_token(self, req: Request, j: int, token: int, result: RunnerOutput) -> None:
        self.counters["generation_tokens"] += 1
        lps = result.logprobs.get(req.request_id)
        if lps is not None:
            req.logprobs.append(lps[j])
            req.cumulative_logprob += lps[j][token].logprob

    def _check_stop(self, req: Request) -> Optional[RequestStatus]:
        status = check_stop(req, self.model_config.max_model_len)
        parent = self._child_parent.get(req.request_id)
        if parent is None:
            return status
        token_stop = status is RequestStatus.FINISHED_STOPPED
        if not token_stop or req.params.include_stop_str_in_output:
            # The stop token itself is not part of the text (as in vLLM).
            matched = parent.detoks[req.request_id].add_token(req.output_token_ids[-1])
            if matched is not None and len(req.output_token_ids) >= req.params.min_tokens:
                req.stop_reason = matched
                return RequestStatus.FINISHED_STOPPED
        return status

    def _make_outputs(self, progressed: list[Request]) -> list[RequestOutput]:
        parents: dict[str, RequestGroup] = {}
        for req in progressed:
            parent = self._child_parent.get(req.request_id)
            if parent is not None:
                parents[parent.request_id] = parent
                parent.num_finished += req.status.finished  # a child finishes in one step only
        outputs = []
        for parent in parents.values():
            if parent.final_only and not parent.finished:
                continue
            outputs.append(parent.make_output())
            if parent.finished:
                self.counters["request_success"] += 1
                self.parents.pop(parent.request_id, None)
                for c in parent.children:
                    self._child_parent.pop(c.request_id, None)
        return outputs

    # -- metrics -----------------------------------------------------------------------------
    def get_metrics(self) -> list[Union[Metric, Vector]]:
        c = self.counters
        used = self.num_blocks - self.kv.num_free_blocks
        metrics: list[Union[Metric, Vector]] = [
            Metric(PREFIX + "prompt_tokens", c["prompt_tokens"]),
            Metric(PREFIX + "generation_tokens", c["generation_tokens"]),
            Metric(PREFIX + "request_success", c["request_success"]),
            Metric(PREFIX + "request_aborted", c["request_aborted"]),
            Metric(PREFIX + "num_preemptions", self.scheduler.num_preemptions),
            Metric(PREFIX + "prefix_cache_queries", self.kv.prefix_queries),
            Metric(PREFIX + "prefix_cache_hits", self.kv.prefix_hits),
            Metric(PREFIX + "num_requests_running", len(self.scheduler.running), kind="gauge"),
            Metric(PREFIX + "num_requests_waiting", len(self.scheduler.waiting), kind="gauge"),
            Metric(PREFIX + "kv_cache_usage_perc", used / self.num_blocks, kind="gauge"),
            Metric(PREFIX + "kv_cache_free_blocks", self.kv.num_free_blocks, kind="gauge"),
        ]
        if self.spec_metrics is not None:
            metrics.extend(self.spec_metrics.metrics())
        return metrics
