"""Engine configuration: frozen dataclasses, every invariant checked here, once.

`EngineConfig.create(model=..., **llm_kwargs)` turns the keyword arguments of `tandem.LLM` (vLLM's
names) into validated configs. Errors name the field and the allowed values.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

import torch

from tandem.distributed.launch import Launch, launch_from
from tandem.distributed.tp_check import check_tp_size
from tandem.quantization import resolve_quantization
from tandem.spec_decode.config import SpeculativeConfig

_DTYPES = {
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float32, "float32": torch.float32,
}
DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3  # vLLM's VLLM_CPU_KVCACHE_SPACE default (4 GiB)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda', got {device!r}.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available; "
                         "use device='cpu' or 'auto'.")
    return torch.device(device)


def resolve_dtype(dtype: Union[str, torch.dtype], hf_config: Any, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32  # CPU matmuls in bf16/fp16 are slow without AMX; keep exact fp32
        cfg = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        cfg = _DTYPES.get(cfg, cfg) if isinstance(cfg, str) else cfg
        return torch.bfloat16 if cfg in (None, torch.float32) else cfg
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}.")
    return _DTYPES[dtype]


# "auto" detects safetensors or GGUF; "dummy" initialises random weights (vLLM's, benchmarks).
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


@dataclass(frozen=True)
class ModelConfig:
    model: str                       # what the user asked for (name or path)
    model_dir: str                   # resolved directory on disk
    gguf_file: Optional[str]         # set when the weights come from a GGUF file
    tokenizer: str                   # tokenizer name or path
    hf_config: Any                   # transformers PretrainedConfig
    dtype: torch.dtype
    max_model_len: int
    seed: int
    revision: Optional[str] = None
    load_format: str = "auto"        # "dummy": random weights (benchmarks), no weight files
    quantization: Optional[str] = None  # weights kept quantized: gguf, q8_0, q4_0, q4_k (None: float)

    @property
    def architecture(self) -> str:
        return (getattr(self.hf_config, "architectures", None) or ["?"])[0]

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)

    @staticmethod
    def create(model: str, tokenizer: Optional[str], dtype: Union[str, torch.dtype],
               max_model_len: Optional[int], seed: int, revision: Optional[str],
               device: torch.device, field_prefix: str = "", load_format: str = "auto"
               ) -> ModelConfig:
        from tandem.loader.hf_config import load_hf_config
        from tandem.loader.model_source import resolve_model

        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {list(LOAD_FORMATS)}, got "
                             f"{load_format!r} (formats are detected from the files).")
        source = resolve_model(model, revision=revision, need_weights=load_format != "dummy")
        hf_config = load_hf_config(source)
        derived = model_max_len(hf_config)
        if max_model_len is None:
            max_model_len = derived
        elif max_model_len < 1:
            raise ValueError(f"{field_prefix}max_model_len must be at least 1, got {max_model_len}.")
        elif max_model_len > derived:
            raise ValueError(
                f"User-specified {field_prefix}max_model_len ({max_model_len}) is greater than the "
                f"derived max_model_len (max_position_embeddings={derived} in the model's config). "
                f"Use max_model_len <= {derived}.")
        gguf = str(source.gguf_file) if source.gguf_file else None
        if tokenizer is not None:  # a Hub id resolves like a model: cache, then bundled copy
            tok = resolve_model(tokenizer, revision=None)
            tokenizer = str(tok.gguf_file) if tok.gguf_file else str(tok.model_dir)
        return ModelConfig(model=model, model_dir=str(source.model_dir), gguf_file=gguf,
                           tokenizer=tokenizer or (gguf or str(source.model_dir)),
                           hf_config=hf_config, dtype=resolve_dtype(dtype, hf_config, device),
                           max_model_len=int(max_model_len), seed=seed, revision=revision,
                           load_format=load_format)


def model_max_len(hf_config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: Optional[int] = None  # CPU budget; default DEFAULT_CPU_KV_CACHE_BYTES

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
    draft_has_own_blocks: bool = False  # a TLI draft: its positions differ, it has its own blocks

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots reserved after a request's tokens for the draft's writes into the same blocks."""
        return 0 if self.draft_has_own_blocks else self.num_speculative_tokens

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.max_num_batched_tokens < 1 + self.num_speculative_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be larger than "
                f"num_speculative_tokens ({self.num_speculative_tokens}): each step verifies 1 + k "
                "tokens per request.")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    nnodes: int = 1            # machines the ranks spread over (ranks split evenly)
    node_rank: int = 0         # this machine's place among them; > 0 runs workers only
    master_addr: str = "127.0.0.1"
    master_port: int = 0       # 0: a free port (one machine only)

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {tp}.")
        if self.nnodes < 1 or tp % self.nnodes:
            raise ValueError(f"nnodes={self.nnodes} must be at least 1 and divide "
                             f"tensor_parallel_size={tp} (each node runs the same number of ranks).")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes}).")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("Several nodes need an agreed rendezvous: pass --master-addr and "
                             "--master-port (or MASTER_ADDR and MASTER_PORT) on every node.")

    @property
    def launch(self) -> Launch:
        return Launch(self.tensor_parallel_size, self.nnodes, self.node_rank, self.master_addr,
                      self.master_port)


def _check_weights_and_cache(kv_cache_dtype: str, max_logprobs: int) -> None:
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported: the KV cache "
                         "keeps the model's dtype; supported: ['auto'].")
    if not isinstance(max_logprobs, int) or max_logprobs < -1:
        raise ValueError(f"max_logprobs must be -1 (no limit) or at least 0, got {max_logprobs}.")


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

    @staticmethod
    def create(model: str, tokenizer: Optional[str] = None, dtype: Union[str, torch.dtype] = "auto",
               seed: int = 0, max_model_len: Optional[int] = None, tensor_parallel_size: int = 1,
               gpu_memory_utilization: float = 0.9, max_num_seqs: Optional[int] = None,
               max_num_batched_tokens: Optional[int] = None, enable_prefix_caching: bool = True,
               device: str = "auto", speculative_config: Union[None, dict, SpeculativeConfig] = None,
               revision: Optional[str] = None, block_size: int = 16,
               kv_cache_memory_bytes: Optional[int] = None, disable_log_stats: bool = False,
               enforce_eager: bool = True, trust_remote_code: bool = False,
               nnodes: Optional[int] = None, node_rank: Optional[int] = None,
               master_addr: Optional[str] = None, master_port: Optional[int] = None,
               quantization: Optional[str] = None, kv_cache_dtype: str = "auto",
               max_logprobs: int = 20, generation_config: str = "auto",
               load_format: str = "auto", **unknown: Any) -> EngineConfig:
        """`enforce_eager` and `trust_remote_code` are accepted so vLLM call sites run unchanged:
        tandem always runs eagerly and only runs its own model code."""
        if unknown:
            names = [n for n in inspect.signature(EngineConfig.create).parameters if n != "unknown"]
            raise TypeError(f"Unexpected engine argument(s) {sorted(unknown)}; supported: {names}.")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}.")
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
            draft_has_own_blocks=bool(spec and spec.uses_vocab_mapping))
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                            gpu_memory_utilization=gpu_memory_utilization,
                            kv_cache_memory_bytes=kv_cache_memory_bytes)
        return EngineConfig(model_config, cache, sched, parallel, dev, spec,
                            log_stats=not disable_log_stats, max_logprobs=max_logprobs,
                            generation_config=generation_config)
