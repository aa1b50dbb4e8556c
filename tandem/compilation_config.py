"""CUDA graphs' configuration under vLLM's names: `compilation_config` (its
`cudagraph_capture_sizes`, `max_cudagraph_capture_size` and `cudagraph_mode` keys, or an
optimization level) and `cuda_graph_sizes` (`--cuda-graph-sizes`).

A size is a batch size in requests: each one is captured at query length 1 (decoding) and, when
speculating, 1 + k (verification), so `worker/graph_runner.py` pads a decode or verification
batch to the next size. The default is vLLM's pattern up to `max_num_seqs`: 1, 2, 4, 8, 16, 24,
32, ..., and `max_num_seqs` itself (so every decode batch has a graph). Whether graphs are used at
all is the engine's `enforce_eager` and the device (CUDA with the Triton kernels; nothing is
captured on the CPU).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

logger = logging.getLogger("tandem")

# vLLM's modes. "NONE" turns graphs off; the others ask for graphs, and ours are always full
# graphs of decode and verification steps (prefill and mixed batches run eagerly).
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# vLLM's torch.compile settings: accepted so vLLM configs run, logged as having no effect.
NO_EFFECT_KEYS = ("level", "mode", "use_inductor", "compile_sizes", "custom_ops",
                  "splitting_ops", "backend")
KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode")


def vllm_size_pattern(largest: int) -> list[int]:
    """vLLM's capture sizes up to `largest`: 1, 2, 4, then every multiple of 8."""
    return [s for s in (1, 2, 4) if s <= largest] + list(range(8, largest + 1, 8))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _size_list(value: Any, field: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not value \
            or not all(_positive_int(v) for v in value):
        raise ValueError(f"{field} must be a non-empty list of positive integers (batch sizes "
                         f"to capture CUDA graphs for), got {value!r}.")
    return list(value)


@dataclass(frozen=True)
class CompilationConfig:
    cudagraph_capture_sizes: tuple[int, ...] = ()  # batch sizes in requests, ascending
    cudagraph_mode: str = "FULL_DECODE_ONLY"

    @property
    def use_cudagraph(self) -> bool:
        return self.cudagraph_mode != "NONE" and bool(self.cudagraph_capture_sizes)

    @staticmethod
    def create(value: Union[None, int, dict, CompilationConfig],
               cuda_graph_sizes: Optional[Sequence[int]], max_num_seqs: int) -> CompilationConfig:
        """From `compilation_config` (None, an optimization level, a dict of vLLM's keys, or a
        CompilationConfig) and `cuda_graph_sizes` (one value N: vLLM's pattern up to N; several:
        those sizes); sizes above max_num_seqs are dropped (logged)."""
        if isinstance(value, CompilationConfig):
            value = {"cudagraph_capture_sizes": list(value.cudagraph_capture_sizes),
                     "cudagraph_mode": value.cudagraph_mode}
        if value is None:
            value = {}
        elif _positive_int(value) or value == 0:  # vLLM's -O level: torch.compile's, not ours
            logger.info("compilation_config=%s (an optimization level) has no effect in tandem: "
                        "it compiles nothing; CUDA graphs follow enforce_eager", value)
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"compilation_config must be a dict of {list(KEYS)} (vLLM's keys) or "
                             f"an optimization level 0-3, got {value!r}.")
        unknown = sorted(set(value) - set(KEYS) - set(NO_EFFECT_KEYS))
        if unknown:
            raise ValueError(f"compilation_config has unknown key(s) {unknown}; supported: "
                             f"{list(KEYS)} (and {list(NO_EFFECT_KEYS)}, accepted with no "
                             f"effect).")
        ignored = sorted(set(value) & set(NO_EFFECT_KEYS))
        if ignored:
            logger.info("compilation_config keys %s have no effect in tandem (it compiles "
                        "nothing)", ignored)
        mode = value.get("cudagraph_mode", "FULL_DECODE_ONLY")
        if not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES:
            raise ValueError(f"compilation_config['cudagraph_mode'] must be one of "
                             f"{list(CUDAGRAPH_MODES)}, got {mode!r}.")
        sizes = _sizes(value, cuda_graph_sizes, max_num_seqs)
        return CompilationConfig(tuple(sizes), mode.upper())


def _sizes(value: dict, cuda_graph_sizes: Optional[Sequence[int]], max_num_seqs: int) -> list[int]:
    given = [name for name, v in (("compilation_config['cudagraph_capture_sizes']",
                                   value.get("cudagraph_capture_sizes")),
                                  ("compilation_config['max_cudagraph_capture_size']",
                                   value.get("max_cudagraph_capture_size")),
                                  ("cuda_graph_sizes", cuda_graph_sizes)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} both set the CUDA graph sizes: give one.")
    if value.get("cudagraph_capture_sizes") is not None:
        sizes = _size_list(value["cudagraph_capture_sizes"],
                           "compilation_config['cudagraph_capture_sizes']")
    elif value.get("max_cudagraph_capture_size") is not None:
        largest = value["max_cudagraph_capture_size"]
        if not _positive_int(largest):
            raise ValueError(f"compilation_config['max_cudagraph_capture_size'] must be a "
                             f"positive integer, got {largest!r}.")
        sizes = vllm_size_pattern(largest)
    elif cuda_graph_sizes is not None:
        sizes = _size_list(cuda_graph_sizes, "cuda_graph_sizes")
        if len(sizes) == 1:  # vLLM: one value is the largest size of its pattern
            sizes = vllm_size_pattern(sizes[0])
    else:
        return sorted(set(vllm_size_pattern(max_num_seqs)) | {max_num_seqs})
    kept = sorted({s for s in sizes if s <= max_num_seqs})
    dropped = sorted({s for s in sizes if s > max_num_seqs})
    if not kept:
        raise ValueError(f"{given[0]}: every size {sorted(set(sizes))} is above max_num_seqs="
                         f"{max_num_seqs}, the largest batch; give sizes up to it.")
    if dropped:
        logger.info("CUDA graph sizes %s are above max_num_seqs=%d and are not captured",
                    dropped, max_num_seqs)
    return kept
