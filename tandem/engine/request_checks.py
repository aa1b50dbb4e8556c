"""What the engine checks about a request before queueing it (each error names the limit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tandem.config import EngineConfig, ModelConfig


def validate_prompt(ids: list[int], mc: ModelConfig, config: EngineConfig,
                    num_blocks: int) -> None:
    if not ids:
        raise ValueError("The decoder prompt cannot be empty.")
    bad = [t for t in ids if t < 0 or t >= mc.vocab_size]
    if bad:
        raise ValueError(f"Token id {bad[0]} is out of vocabulary (vocab size {mc.vocab_size}).")
    if len(ids) > mc.max_model_len:
        raise ValueError(
            f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
            f"of {mc.max_model_len}. Make sure that `max_model_len` is no smaller than the "
            "number of text tokens.")
    bs = config.cache_config.block_size
    need = -(-(len(ids) + 1 + config.scheduler_config.num_lookahead_tokens) // bs)
    if need > num_blocks:
        raise ValueError(f"The prompt ({len(ids)} tokens) needs {need} KV blocks but the "
                         f"cache has only {num_blocks}; raise kv_cache_memory_bytes.")


def check_logprobs(params: SamplingParams, max_logprobs: int, vocab_size: int) -> None:
    """vLLM's max_logprobs (-1 asks for the whole vocabulary)."""
    for kind, n in (("sample", params.logprobs), ("prompt", params.prompt_logprobs)):
        wanted = vocab_size if n == -1 else n
        if wanted is not None and max_logprobs != -1 and wanted > max_logprobs:
            raise ValueError(f"Requested {kind} logprobs of {wanted}, which is greater than max "
                             f"allowed: {max_logprobs}")
