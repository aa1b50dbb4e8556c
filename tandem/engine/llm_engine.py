"""LLMEngine: owns the models, the KV cache, the scheduler and the step loop.

One `step()` = schedule -> target forward + (rejection) sampling -> append tokens and check stops
-> draft proposals for the next step -> RequestOutputs for the requests that progressed.
A request that fails inside a step fails alone: the step is redone request by request to find it,
it is finished with an error, and the rest of the batch goes on (keyed randomness makes a redone
step give the same tokens).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from typing import Any, Callable, Optional, Union


from tandem.config import EngineConfig
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.request import Request, RequestStatus
from tandem.core.scheduler import Scheduler
from tandem.engine.calibration import calibrate
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.engine_metrics import engine_metrics
from tandem.engine.drafting import Drafting
from tandem.engine.fault_isolation import execute_isolated
from tandem.engine.latency_metrics import LatencyMetrics
from tandem.engine.request_checks import check_logprobs, validate_prompt
from tandem.engine.request_group import RequestGroup
from tandem.engine.spec_tracking import SpecTracker
from tandem.engine.stop_checker import check_finished
from tandem.distributed.executor import make_executor
from tandem.loader.generation_config import sampling_defaults
from tandem.loader.tokenizer import load_tokenizer
from tandem.logprob_rows import LogprobRows
from tandem.metrics import AnyMetric
from tandem.outputs import RequestOutput, SpecDecodeRequestStats
from tandem.sample.grammar import GrammarCompiler, GrammarMatcher
from tandem.sample.reasoning_gate import ReasoningGrammar
from tandem.sample.random import SeededRandom
from tandem.sampling_params import SamplingParams
from tandem.spec_decode.metrics import SpecDecodeMetrics
from tandem.spec_decode.factory import build_proposer, build_samplers
from tandem.spec_decode.combined import with_lookup
from tandem.spec_decode.model_free import Proposer, build_model_free_proposer
from tandem.spec_decode.schedule import BatchSizeSchedule
from tandem.worker.kv_cache import check_format, determine_num_blocks, kv_formats
from tandem.worker.model_runner import ModelRunner, RunnerOutput

logger = logging.getLogger("tandem")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        mc = config.model_config
        self.model_config = mc
        self.device = config.device
        self.tokenizer = load_tokenizer(mc)
        # What a step returns for each request: a cumulative RequestOutput by default; the
        # engine core process installs its delta encoder, which reads only what is new.
        self.output_builder: Optional[Callable[[RequestGroup], Any]] = None
        t0 = time.perf_counter()
        spec = config.speculative_config
        # The executor loads the models (this rank's shards) and starts any other ranks.
        self.executor = make_executor(config)
        self.model = self.executor.models["target"]
        self.draft_model = self.executor.models["draft"]
        logger.info("Loaded %s (%s%s) in %.1f s", mc.model, mc.architecture,
                    f", drafter {spec.model or spec.method}" if spec else "",
                    time.perf_counter() - t0)
        formats = kv_formats(config)
        models = [(m, formats[w]) for w, m in (("target", self.model), ("draft", self.draft_model))
                  if m is not None]
        for m, fmt in models:
            check_format(m, fmt)
        cache, sched = config.cache_config, config.scheduler_config
        self.num_blocks = determine_num_blocks(models, cache, self.device, mc.max_model_len,
                                               sched.max_num_seqs, sched.num_lookahead_tokens)
        self.executor.allocate_kv(self.num_blocks)
        self.kv = KVCacheManager(self.num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.scheduler = Scheduler(sched, self.kv)
        self.runner = ModelRunner(self.executor.forward("target"), self.device, mc.vocab_size,
                                  self.tokenizer, *build_samplers(spec, mc.seed))
        self.proposer: Optional[Proposer] = None
        if spec is not None and spec.model_free:
            self.proposer = build_model_free_proposer(spec, spec.draft_max_model_len)
        elif spec is not None:
            self.proposer = with_lookup(spec, build_proposer(  # a lookup beside it (combined.py)
                config, self.executor.forward("draft"), self.kv, self.device), mc.max_model_len)
        if hasattr(self.proposer, "finished"):  # a lookup drops (or keeps) what it knew
            self.scheduler.on_finish = self.proposer.finished
        self.drafting = (Drafting(self.proposer, spec.adaptive, self._fail,
                                  BatchSizeSchedule(spec.num_speculative_tokens_per_batch_size,
                                                    spec.num_speculative_tokens)
                                  if spec.num_speculative_tokens_per_batch_size else None)
                         if self.proposer is not None else None)
        self._rng = random.Random(mc.seed)
        self.parents: dict[str, RequestGroup] = {}
        self._child_parent: dict[str, RequestGroup] = {}
        self._failed: dict[str, RequestGroup] = {}   # failed this step, reported by step()
        # Child sequences get ids of their own, never derived from the user's request id, so no
        # client-chosen id can collide with another request's sequence.
        self._seq_ids = itertools.count()
        self.sampling_defaults = sampling_defaults(mc.model_dir, config.generation_config)
        self.grammars = GrammarCompiler(self.tokenizer, mc.vocab_size)  # structured outputs
        self.eos_token_id = self.tokenizer.eos_token_id
        self._extra_stop_ids = self._config_eos_ids() - {self.eos_token_id}
        self.reset_stats()
        if self.drafting is not None and self.drafting.adaptive is not None:
            calibrate(self)  # adaptive speculation starts from measured costs, not priors

    def reset_stats(self) -> None:
        """Zero every counter and histogram /metrics reports (after load-time calibration)."""
        spec = self.config.speculative_config
        self.spec_metrics: Optional[SpecDecodeMetrics] = (
            SpecDecodeMetrics(spec.num_speculative_tokens) if spec is not None else None)
        self.spec_tracker = SpecTracker(self.spec_metrics,
                                        spec.num_speculative_tokens if spec else 0,
                                        self.drafting.observe_acceptance if self.drafting
                                        else None)
        self.latency = LatencyMetrics(self.model_config.max_model_len)
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "request_success": 0,
                         "request_aborted": 0, "request_failed": 0}
        self.kv.prefix_queries = self.kv.prefix_hits = self.scheduler.num_preemptions = 0

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
        params = params.clone() if params is not None else self.default_sampling_params()
        if request_id in self.parents:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        if isinstance(prompt, str):
            text: Optional[str] = prompt
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            text, ids = None, [int(t) for t in prompt]
        validate_prompt(ids, self.model_config, self.config, self.num_blocks)
        check_logprobs(params, self.config.max_logprobs, self.model_config.vocab_size)
        mc = self.model_config
        if params.max_tokens is None:
            params.max_tokens = max(1, mc.max_model_len - len(ids))
        params._all_stop_token_ids = set(params.stop_token_ids) | self._extra_stop_ids
        grammar = (self.grammars.prototype(params.structured_outputs)
                   if params.structured_outputs is not None else None)
        group = RequestGroup(request_id, text, ids, params, final_only,
                             window=self.config.scheduler_config.max_num_seqs, grammar=grammar,
                             stream_interval=self.config.scheduler_config.stream_interval)
        self.parents[request_id] = group
        self._spawn(group)
        self.counters["prompt_tokens"] += len(ids) * params.n

    def _spawn(self, group: RequestGroup) -> None:
        for child in group.spawn(self._make_child):
            self._child_parent[child.request_id] = group
            self.scheduler.add_request(child)

    def _make_child(self, group: RequestGroup, index: int) -> Request:
        params = group.params
        if params.n > 1 and params.seed is not None:
            params = params.clone()
            params.seed = group.params.seed + index  # distinct, reproducible children
        child = Request(request_id=f"seq-{next(self._seq_ids)}",
                        prompt_token_ids=group.prompt_token_ids, params=params,
                        prompt=group.prompt, rng=self._random(params.seed),
                        eos_token_id=self.eos_token_id, parent_id=group.request_id, index=index,
                        spec_stats=SpecDecodeRequestStats() if self.proposer else None,
                        arrival_time=group.arrival_time,
                        grammar=self._grammar_matcher(group),
                        logprobs=LogprobRows(self.runner.token_texts))
        group.detoks[child.request_id] = IncrementalDetokenizer(
            self.tokenizer, group.prompt_token_ids, params.stop,
            params.include_stop_str_in_output, params.skip_special_tokens)
        return child

    def _grammar_matcher(self, group: RequestGroup) -> Optional[Any]:
        """A child's own grammar state; with think tags the grammar starts after the reasoning."""
        if group.grammar is None:
            return None
        matcher = GrammarMatcher(group.grammar, self.model_config.vocab_size)
        tags = group.params._think_tags
        return ReasoningGrammar(matcher, tags) if tags is not None else matcher

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation-config defaults (vLLM's behaviour)."""
        return SamplingParams(**self.sampling_defaults)

    def _random(self, seed: Optional[int]) -> SeededRandom:
        return SeededRandom(seed if seed is not None else self._rng.getrandbits(63))

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        for child in parent.children:
            self._child_parent.pop(child.request_id, None)
            if not child.status.finished:
                self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
                self.latency.on_finished(child)
        self.counters["request_aborted"] += 1

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def failure(self) -> Optional[str]:
        """Why the engine cannot go on (a tensor-parallel worker died), or None."""
        return self.executor.failure

    def shutdown(self) -> None:
        """Stop any worker processes (also done when the engine is collected or at exit)."""
        self.executor.shutdown()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix; refused (False) while requests hold KV blocks."""
        if self.kv.reset_prefix_cache():
            logger.info("Prefix cache reset")
            return True
        logger.warning("Failed to reset the prefix cache: %d request(s) still hold KV blocks",
                       len(self.scheduler.running))
        return False

    def num_free_kv_blocks(self) -> int:
        return self.kv.num_free_blocks

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if not sched and self.scheduler.running:
            # Everything runnable waits for drafts: let the draft catch up alone this step, or,
            # when it cannot make progress (no memory to spare), go on without drafts.
            if self.drafting is not None and self.drafting.catch_up(self.scheduler.running):
                return self._make_outputs([])
            sched = self.scheduler.schedule(force=True)
        if not sched:
            return self._make_outputs([])
        t0 = time.perf_counter()
        result = execute_isolated(self.runner, sched, self._fail)
        if self.drafting is not None:
            self.drafting.observe_target(sched, time.perf_counter() - t0)
        self.spec_tracker.record_step(sched, result)
        for rid, plp in result.prompt_logprobs.items():
            req = self.scheduler.requests.get(rid)
            if req is not None:
                req.prompt_logprobs.extend(plp)
        progressed = self.scheduler.update_from_output(
            sched, result.sampled, self._check_stop,
            lambda req, j, tok: self._on_token(req, j, tok, result), on_error=self._fail)
        self.latency.on_step((s.request for s in sched.scheduled), progressed)
        if self.drafting is not None:
            self.drafting.after_step(self.scheduler.running)
            if self.config.log_stats:
                self.spec_metrics.maybe_log()
        return self._make_outputs(progressed)

    def _fail(self, req: Request, error: BaseException) -> None:
        """Finish the user request `req` belongs to with an error; free all its sequences."""
        group = self._child_parent.get(req.request_id)
        logger.error("request %s failed inside the engine step and was finished with an error: "
                     "%s: %s", group.request_id if group else req.request_id,
                     type(error).__name__, error, exc_info=error)
        if group is None:
            self.scheduler.finish_request(req, RequestStatus.FINISHED_ERROR)
            self.latency.on_finished(req)
            return
        group.error = f"{type(error).__name__}: {error}"
        for child in group.children:
            if not child.status.finished:
                self.scheduler.finish_request(child, RequestStatus.FINISHED_ERROR)
                self.latency.on_finished(child)
        self._failed[group.request_id] = group

    def _on_token(self, req: Request, j: int, token: int, result: RunnerOutput) -> None:
        self.counters["generation_tokens"] += 1
        self.spec_tracker.on_token(req, j, result)
        if req.grammar is not None:
            req.grammar.consume(token)
        lps = result.logprobs.get(req.request_id)
        if lps is not None:  # row j's first entry is the sampled token
            req.logprobs.append_row(lps, j)
            req.cumulative_logprob += lps.chosen_logprob(j)

    def _check_stop(self, req: Request) -> Optional[RequestStatus]:
        parent = self._child_parent.get(req.request_id)
        detok = parent.detoks[req.request_id] if parent is not None else None
        return check_finished(req, detok, self.model_config.max_model_len)

    def _make_outputs(self, progressed: list[Request]) -> list[RequestOutput]:
        groups: dict[str, RequestGroup] = {}
        for req in progressed:
            group = self._child_parent.get(req.request_id)
            if group is not None and group.error is None:
                groups[group.request_id] = group
                if req.status.finished:  # a child finishes in one step only
                    group.num_finished += 1
                    self._spawn(group)
        groups.update(self._failed)
        self._failed = {}
        outputs = []
        for group in groups.values():
            if not group.output_due():
                continue
            outputs.append(group.make_output() if self.output_builder is None
                           else self.output_builder(group))
            if group.finished:
                self.counters["request_failed" if group.error else "request_success"] += 1
                self.parents.pop(group.request_id, None)
                for c in group.children:
                    self._child_parent.pop(c.request_id, None)
        return outputs

    # -- metrics -----------------------------------------------------------------------------
    def get_metrics(self) -> list[AnyMetric]:
        return engine_metrics(self.counters, self.kv, self.scheduler, self.num_blocks,
                              self.spec_metrics, self.latency)
