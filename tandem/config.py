"""Engine configuration: frozen dataclasses, every invariant checked here, once.

`EngineConfig.create(model=..., **llm_kwargs)` turns the keyword arguments of `tandem.LLM` (vLLM's
names) into validated configs. Errors name the field and the allowed values.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

import torch

from tandem.attention.kv_format import check_kv_cache_dtype
from tandem.attention.kv_format import resolve as resolve_kv_format
from tandem.compilation_config import CompilationConfig
from tandem.distributed.launch import launch_from
from tandem.distributed.parallel_config import ParallelConfig
from tandem.distributed.tp_check import check_tp_size
from tandem.model_config import ModelConfig, resolve_device
from tandem.quantization import resolve_quantization
from tandem.spec_decode.config import SpeculativeConfig

# ModelConfig and ParallelConfig live a level down (the speculative config needs them too);
# they are named here as well, with the engine's other configs.
__all__ = ["CacheConfig", "CompilationConfig", "DEFAULT_CPU_KV_CACHE_BYTES", "EngineConfig",
           "ModelConfig", "ParallelConfig", "SchedulerConfig", "SpeculativeConfig"]

DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3  # vLLM's VLLM_CPU_KVCACHE_SPACE default (4 GiB)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: Optional[int] = None  # CPU budget; default DEFAULT_CPU_KV_CACHE_BYTES
    kv_cache_dtype: str = "auto"  # the cache's row format (attention/kv_format.py)

    def __post_init__(self) -> None:
        if self.block_size not in (1, 8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of [1, 8, 16, 32, 64, 128], got {self.block_size}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}.")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be positive, got {self.kv_cache_memory_bytes}.")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_speculative_tokens: int = 0  # k when speculating
    # Where a draft keeps its KV: "shared" (a same-vocabulary draft model, in the target's
    # blocks), "own" (a TLI draft: its positions differ, it has its own blocks), "none" (a
    # model-free method: no draft KV at all).
    draft_kv: str = "shared"
    # A streamed request's output goes out at its first token, then once this many new tokens
    # have come (and when it finishes): vLLM's --stream-interval, fewer, larger chunks for
    # clients that pay per chunk.
    stream_interval: int = 1
    # vLLM's --watermark: the fraction of all KV blocks a waiting (or preempted) request must
    # leave free when it is admitted beside running ones, so that the running requests' growth
    # does not preempt it again within a few steps (core/scheduler.py).
    watermark: float = 0.0

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots reserved after a request's tokens for the draft's writes into the same blocks."""
        return self.num_speculative_tokens if self.draft_kv == "shared" else 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if (not isinstance(self.watermark, (int, float)) or isinstance(self.watermark, bool)
                or not 0.0 <= self.watermark < 1.0):
            raise ValueError("watermark must be a fraction of the KV cache blocks in [0.0, 1.0) "
                             f"(0 turns it off), got {self.watermark!r}.")
        if (not isinstance(self.stream_interval, int) or isinstance(self.stream_interval, bool)
                or self.stream_interval < 1):
            raise ValueError("stream_interval must be an integer of at least 1 (tokens per "
                             f"streamed chunk), got {self.stream_interval!r}.")
        if self.max_num_batched_tokens < 1 + self.num_speculative_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be larger than "
                f"num_speculative_tokens ({self.num_speculative_tokens}): each step verifies 1 + k "
                "tokens per request.")


def _check_weights_and_cache(kv_cache_dtype: str, max_logprobs: int) -> None:
    check_kv_cache_dtype(kv_cache_dtype)
    if not isinstance(max_logprobs, int) or max_logprobs < -1:
        raise ValueError(f"max_logprobs must be -1 (no limit) or at least 0, got {max_logprobs}.")


def _check_cache_formats(kv_cache_dtype: str, mc: ModelConfig,
                         spec: Optional[SpeculativeConfig], device: torch.device) -> None:
    """Each model's KV cache format resolves against its dtype, and on CUDA is that dtype (the
    CUDA kernels read a cache of the model's own type)."""
    checks = [(kv_cache_dtype, mc.dtype, "kv_cache_dtype")]
    if spec is not None and not spec.model_free:
        own = spec.kv_cache_dtype
        checks.append((own or kv_cache_dtype, spec.draft_model_config.dtype,
                       "speculative_config['kv_cache_dtype']" if own else "kv_cache_dtype"))
    for value, dtype, key in checks:
        fmt = resolve_kv_format(value, dtype, device, key)
        if device.type == "cuda" and fmt.storage is not dtype:
            raise ValueError(f"{key}={value!r} is not supported on CUDA: its kernels read a KV "
                             f"cache of the model's own dtype ({dtype}); use 'auto'.")


def _parallel_config(tp: int, nnodes: Optional[int], node_rank: Optional[int],
                     master_addr: Optional[str], master_port: Optional[int]) -> ParallelConfig:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {tp!r}.")
    if tp == 1:
        return ParallelConfig(1)
    # The rendezvous environment variables count only when ranks are asked for.
    launch = launch_from(tp, nnodes, node_rank, master_addr, master_port)
    return ParallelConfig(tp, launch.nnodes, launch.node_rank, launch.master_addr,
                          launch.master_port)


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device: torch.device
    speculative_config: Optional[SpeculativeConfig] = None
    log_stats: bool = True  # the periodic speculative-decoding log line
    max_logprobs: int = 20  # most logprobs per token a request may ask for (-1: no limit)
    generation_config: str = "auto"  # defaults for omitted sampling fields: auto, vllm or a path
    # CUDA graphs of decode/verify steps where they exist (CUDA with the Triton kernels); on the
    # CPU there is nothing to capture, so False (vLLM's default) runs eagerly there as ever.
    enforce_eager: bool = False
    compilation_config: CompilationConfig = CompilationConfig()

    @staticmethod
    def create(model: str, tokenizer: Optional[str] = None, dtype: Union[str, torch.dtype] = "auto",
               seed: int = 0, max_model_len: Optional[int] = None, tensor_parallel_size: int = 1,
               gpu_memory_utilization: float = 0.9, max_num_seqs: Optional[int] = None,
               max_num_batched_tokens: Optional[int] = None, enable_prefix_caching: bool = True,
               device: str = "auto", speculative_config: Union[None, dict, SpeculativeConfig] = None,
               revision: Optional[str] = None, block_size: int = 16,
               kv_cache_memory_bytes: Optional[int] = None, disable_log_stats: bool = False,
               enforce_eager: bool = False, trust_remote_code: bool = False,
               nnodes: Optional[int] = None, node_rank: Optional[int] = None,
               master_addr: Optional[str] = None, master_port: Optional[int] = None,
               quantization: Optional[str] = None, kv_cache_dtype: str = "auto",
               max_logprobs: int = 20, generation_config: str = "auto",
               load_format: str = "auto",
               compilation_config: Union[None, int, dict, CompilationConfig] = None,
               cuda_graph_sizes: Optional[list[int]] = None, stream_interval: int = 1,
               watermark: float = 0.0, **unknown: Any) -> EngineConfig:
        """`trust_remote_code` is accepted so vLLM call sites run unchanged: tandem only runs its
        own model code. `enforce_eager`, `compilation_config` and `cuda_graph_sizes` are vLLM's
        CUDA-graph settings (compilation_config.py)."""
        if unknown:
            names = [n for n in inspect.signature(EngineConfig.create).parameters if n != "unknown"]
            raise TypeError(f"Unexpected engine argument(s) {sorted(unknown)}; supported: {names}.")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}.")
        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager must be true or false, got {enforce_eager!r}.")
        dev = resolve_device(device)
        parallel = _parallel_config(tensor_parallel_size, nnodes, node_rank, master_addr,
                                    master_port)
        model_config = ModelConfig.create(model, tokenizer, dtype, max_model_len, seed, revision,
                                          dev, load_format=load_format)
        _check_weights_and_cache(kv_cache_dtype, max_logprobs)
        model_config = replace(model_config, quantization=resolve_quantization(
            quantization, model_config.gguf_file, model_config.dtype, dev,
            parallel.tensor_parallel_size))
        check_tp_size(model_config.hf_config, parallel.tensor_parallel_size,
                      "tensor_parallel_size", model)
        spec = None
        if speculative_config is not None:
            spec = SpeculativeConfig.create(speculative_config, model_config, parallel, dev)
            if (spec.draft_tensor_parallel_size or 1) > 1:
                check_tp_size(spec.draft_model_config.hf_config, spec.draft_tensor_parallel_size,
                              "speculative_config.draft_tensor_parallel_size", spec.model)
        k = spec.num_speculative_tokens if spec else 0
        sched = SchedulerConfig(
            max_num_seqs=max_num_seqs if max_num_seqs is not None else 256,
            max_num_batched_tokens=(max_num_batched_tokens if max_num_batched_tokens is not None
                                    else max(2048, 256 * (1 + k))),
            max_model_len=model_config.max_model_len, num_speculative_tokens=k,
            draft_kv=("shared" if spec is None else "none" if spec.model_free
                      else "own" if spec.uses_vocab_mapping else "shared"),
            stream_interval=stream_interval, watermark=watermark)
        compilation = CompilationConfig.create(compilation_config, cuda_graph_sizes,
                                               sched.max_num_seqs)
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                            gpu_memory_utilization=gpu_memory_utilization,
                            kv_cache_memory_bytes=kv_cache_memory_bytes,
                            kv_cache_dtype=kv_cache_dtype)
        _check_cache_formats(kv_cache_dtype, model_config, spec, dev)
        return EngineConfig(model_config, cache, sched, parallel, dev, spec,
                            log_stats=not disable_log_stats, max_logprobs=max_logprobs,
                            generation_config=generation_config, enforce_eager=enforce_eager,
                            compilation_config=compilation)
