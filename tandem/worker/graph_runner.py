"""A model's forward for the engine: eager, or a decode/verification step replayed from a CUDA
graph captured per batch-size bucket.

Three ways a `GraphRunner` runs a step, fixed at load:
- off the Triton route (the CPU path, or CUDA without triton): `run_model`, exactly as before;
- on the Triton route (kernels/triton_route.py), eagerly: the step's inputs go through the
  persistent int32 buffers of graph_inputs.py (one copy), the layers read them;
- with graphs (`GraphPlan`: CUDA, the target, enforce_eager off): a step whose requests all
  have at most the largest query length of the plan (1, or 1 + k when speculating) and whose
  request count fits a bucket is padded to the next bucket (requests and query length) and
  replays that bucket's graph; prefill chunks, mixed and larger batches run eagerly.

The graphs hold the decoder stack (embedding to final norm); the LM head runs after the replay on
the rows the step needs (one matmul), so no graph keeps a [bucket x (1 + k), vocab] output alive:
over the default buckets those would hold gigabytes. Capture happens after the KV cache exists
(the graphs hold its addresses, which never move), largest bucket first into one shared memory
pool, each after two warm-up runs (Triton compiles, cuBLAS picks its kernels), with every
request padding (no KV written). On the CPU an eager stand-in takes capture's place: its replay
runs the same forward over the same static buffers, so the padding and bucket logic run in the
tests (tests/kernels_triton/test_triton_engine.py) under Triton's interpreter.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from tandem.attention.context import forward_context
from tandem.config import EngineConfig
from tandem.kernels import triton_route
from tandem.worker.graph_inputs import InputBuffers, StepInputs
from tandem.worker.model_runner import ForwardBatch, run_model

logger = logging.getLogger("tandem")
WARMUP_RUNS = 2


@dataclass(frozen=True)
class GraphPlan:
    sizes: tuple[int, ...]        # batch sizes in requests, ascending
    query_lens: tuple[int, ...]   # (1,) or (1, 1 + k), ascending
    stand_in: bool                # CPU: replays run the captured forward eagerly (tests)

    def keys(self) -> list[tuple[int, int]]:
        """Every (requests, query length) bucket, largest first (capture order)."""
        return sorted(((b, q) for b in self.sizes for q in self.query_lens),
                      key=lambda k: (k[0] * k[1], k[1]), reverse=True)


def pick_bucket(plan: GraphPlan, num_reqs: int, max_query: int) -> Optional[tuple[int, int]]:
    """The smallest bucket holding num_reqs requests of up to max_query new tokens, or None
    (the step runs eagerly)."""
    b = next((s for s in plan.sizes if s >= num_reqs), None)
    q = next((s for s in plan.query_lens if s >= max_query), None)
    return None if b is None or q is None or num_reqs == 0 else (b, q)


class _StandIn:
    """Capture's place on the CPU: each replay runs the forward over the static buffers."""

    def __init__(self, body: Callable[[], torch.Tensor]) -> None:
        self.body = body

    def replay(self) -> torch.Tensor:
        return self.body()


class _CudaGraph:
    def __init__(self, body: Callable[[], torch.Tensor], pool: Any,
                 device: torch.device) -> None:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # compile and autotune outside the capture
            for _ in range(WARMUP_RUNS):
                body()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = body()  # [tokens, hidden], rewritten by every replay

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class GraphRunner:
    def __init__(self, model: nn.Module, block_size: int, device: torch.device,
                 dtype: torch.dtype, max_tokens: int, max_reqs: int, width: int,
                 plan: Optional[GraphPlan] = None) -> None:
        self.model, self.block_size, self.device = model, block_size, device
        self.plan = plan
        self.buffers: Optional[InputBuffers] = None
        if triton_route.serves(device, dtype):
            if plan is not None:  # every bucket fits the persistent buffers
                max_tokens = max(max_tokens, plan.sizes[-1] * plan.query_lens[-1])
                max_reqs = max(max_reqs, plan.sizes[-1])
            self.buffers = InputBuffers(max_tokens, max_reqs, width, block_size, device)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.replays: Counter = Counter()  # steps replayed per bucket (tests, logs)

    def run(self, batch: ForwardBatch, rows: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] (float32) of the flat rows `rows` of `batch`."""
        if self.buffers is None:
            return run_model(self.model, batch, self.block_size, rows, self.device)
        rows = rows.cpu()  # a host tensor already (model_runner, proposer): no sync
        key = self._bucket(batch)
        if key is not None:
            b, q = key
            step = self.buffers.fill(batch.input_ids, batch.positions, batch.query_lens,
                                     batch.seq_lens, batch.block_tables, rows, b * q, b)
            self.replays[key] += 1
            hidden = self.graphs[key].replay()          # [b * q, hidden]
        else:
            step = self._eager_inputs(batch, rows)
            hidden = self._body(step)                    # [T, hidden]
        with torch.inference_mode():
            return self.model.compute_logits(hidden.index_select(0, step.rows)).float()

    def _bucket(self, batch: ForwardBatch) -> Optional[tuple[int, int]]:
        if not self.graphs:
            return None
        key = pick_bucket(self.plan, len(batch.query_lens), max(batch.query_lens, default=0))
        widest = max((len(t) for t in batch.block_tables), default=0)
        return key if key in self.graphs and widest <= self.buffers.width else None

    def _eager_inputs(self, batch: ForwardBatch, rows: torch.Tensor) -> StepInputs:
        tokens, reqs = int(batch.input_ids.shape[0]), len(batch.query_lens)
        widest = max((len(t) for t in batch.block_tables), default=0)
        buffers = self.buffers
        if not buffers.fits(tokens, reqs, widest):  # a one-off batch beyond the buffers' sizes
            buffers = InputBuffers(tokens, reqs, widest, self.block_size, self.device)
        return buffers.fill(batch.input_ids, batch.positions, batch.query_lens, batch.seq_lens,
                            batch.block_tables, rows, tokens, reqs)

    def _body(self, step: StepInputs) -> torch.Tensor:
        """The decoder stack over a step's inputs: hidden states [tokens, hidden]."""
        with forward_context(step.meta), torch.inference_mode():
            return self.model(step.input_ids, step.positions)

    def capture(self) -> None:
        """One graph per bucket of the plan (none without a plan); call once the KV caches are
        bound. A capture that fails leaves the runner eager, logged."""
        if self.plan is None or self.buffers is None or self.graphs:
            return
        cuda = not self.plan.stand_in
        t0 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize(self.device)
            free_before = torch.cuda.mem_get_info(self.device)[0]
            pool = torch.cuda.graph_pool_handle()
        empty = torch.zeros(0, dtype=torch.long)
        try:
            for b, q in self.plan.keys():
                # every request padding: warm-ups and capture write no KV and read none
                step = self.buffers.fill(empty, empty, [], [], [], empty, b * q, b)
                body = (lambda s=step: self._body(s))
                self.graphs[(b, q)] = (_CudaGraph(body, pool, self.device) if cuda
                                       else _StandIn(body))
        except RuntimeError as e:
            self.graphs.clear()
            logger.warning("CUDA graphs: capture failed, running eagerly: %s", e)
            return
        if cuda:
            torch.cuda.synchronize(self.device)
            used = (free_before - torch.cuda.mem_get_info(self.device)[0]) / 2**20
        logger.info("%s: %d graphs (batch sizes %s x query lengths %s) in %.1f s%s",
                    "CUDA graphs" if cuda else "CUDA graph stand-ins (CPU)", len(self.graphs),
                    list(self.plan.sizes), list(self.plan.query_lens),
                    time.perf_counter() - t0, f", {used:.0f} MiB" if cuda else "")


def graph_plan(config: EngineConfig, which: str, model: nn.Module) -> Optional[GraphPlan]:
    """The target's graphs, where they can run: the Triton route on this device (CUDA; the CPU
    only under a test's route, as stand-ins), enforce_eager off, one rank, and no layer that
    reads device values on the host mid-step. The draft runs eagerly (for now)."""
    cc, dev = config.compilation_config, config.device
    if which != "target" or not cc.use_cudagraph or config.enforce_eager:
        if which == "target" and dev.type == "cuda":
            logger.info("CUDA graphs: off (enforce_eager or cudagraph_mode NONE)")
        return None
    if not triton_route.serves(dev, config.model_config.dtype):
        if dev.type == "cuda":
            logger.info("CUDA graphs: off, they need the Triton kernels (see above)")
        return None  # the CPU: nothing to capture
    why = None
    if config.parallel_config.tensor_parallel_size > 1:
        why = "tensor_parallel_size > 1 (collectives inside graphs are not done yet)"
    elif any(getattr(m, "syncs_host", False) for m in model.modules()):
        why = "a layer reads device values on the host mid-step (mixture-of-experts routing)"
    if why is not None:
        logger.info("CUDA graphs: off, %s; running eagerly", why)
        return None
    k = config.scheduler_config.num_speculative_tokens
    return GraphPlan(cc.cudagraph_capture_sizes, (1,) if k == 0 else (1, 1 + k),
                     stand_in=dev.type != "cuda")


def make_runner(config: EngineConfig, which: str, model: nn.Module) -> GraphRunner:
    """The runner of the target or the draft: buffers for a step of max_num_batched_tokens
    tokens over max_num_seqs requests, each request's table as wide as the longest context."""
    sched, block_size = config.scheduler_config, config.cache_config.block_size
    mc = config.model_config
    spec = config.speculative_config
    longest = mc.max_model_len
    if which == "draft" and spec is not None:
        mc = spec.draft_model_config
        longest = max(longest, spec.draft_max_model_len)
    width = -(-(longest + sched.num_speculative_tokens + 1) // block_size)
    return GraphRunner(model, block_size, config.device, mc.dtype, sched.max_num_batched_tokens,
                       sched.max_num_seqs, width, graph_plan(config, which, model))
