"""Sizing and allocating the paged KV tensors for the target and (optionally) the draft model.

Every attention layer of every model gets its own [num_slots, Hkv, row] key and value tensors
with the same number of slots, so one block id means the same slots in all of them. A row holds
one token's D numbers for one KV head in the model's cache format (`kv_cache_dtype`,
attention/kv_format.py; the draft may have its own), so the budget counts bytes: a 16-bit cache
holds twice the tokens of a float32 one, an 8-bit one four times.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from tandem.attention.kv_format import KVFormat, resolve
from tandem.config import DEFAULT_CPU_KV_CACHE_BYTES, CacheConfig

logger = logging.getLogger("tandem")


def kv_formats(config: Any) -> dict[str, KVFormat]:
    """The cache format of the target and of the draft (its speculative_config
    ['kv_cache_dtype'], else the target's setting), each against its own model's dtype."""
    cache, spec = config.cache_config, config.speculative_config
    formats = {"target": resolve(cache.kv_cache_dtype, config.model_config.dtype, config.device)}
    if spec is not None and not spec.model_free:
        own = getattr(spec, "kv_cache_dtype", None)
        formats["draft"] = resolve(own or cache.kv_cache_dtype, spec.draft_model_config.dtype,
                                   config.device, "speculative_config['kv_cache_dtype']" if own
                                   else "kv_cache_dtype")
    return formats


def check_format(model: nn.Module, fmt: KVFormat, key: str = "kv_cache_dtype") -> None:
    """A format every attention layer of the model takes (q8_0: head sizes of 32s)."""
    for a in model.attention_layers():
        if fmt.name == "q8_0" and a.head_dim % 32:
            raise ValueError(f"{key}='q8_0' stores blocks of 32 numbers, and this model's head "
                             f"size is {a.head_dim}; choose 'bfloat16', 'float16' or an fp8 "
                             "type.")


def bytes_per_block(models: list[tuple[nn.Module, KVFormat]], block_size: int) -> int:
    return sum(2 * block_size * a.num_kv_heads * fmt.row_bytes(a.head_dim)
               for m, fmt in models for a in m.attention_layers())


def determine_num_blocks(models: list[tuple[nn.Module, KVFormat]], cache: CacheConfig,
                         device: torch.device, max_model_len: int, max_num_seqs: int,
                         lookahead: int) -> int:
    per_block = bytes_per_block(models, cache.block_size)
    if cache.kv_cache_memory_bytes is not None:
        budget = cache.kv_cache_memory_bytes
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * cache.gpu_memory_utilization) - used
        if budget <= 0:
            raise ValueError(
                f"No memory is left for the KV cache: the model uses {used / 2**30:.2f} GiB of "
                f"{total / 2**30:.2f} GiB and gpu_memory_utilization={cache.gpu_memory_utilization}."
                " Raise gpu_memory_utilization or use a smaller model.")
    else:
        budget = DEFAULT_CPU_KV_CACHE_BYTES
    blocks_per_seq = -(-(max_model_len + lookahead + 1) // cache.block_size)
    num_blocks = min(budget // per_block, blocks_per_seq * max_num_seqs)
    if num_blocks < blocks_per_seq:
        raise ValueError(
            f"The KV cache budget ({budget / 2**20:.1f} MiB, {num_blocks} blocks of "
            f"{cache.block_size} tokens) cannot hold one sequence of max_model_len={max_model_len} "
            f"tokens ({blocks_per_seq} blocks). Increase kv_cache_memory_bytes (or "
            "gpu_memory_utilization) or decrease max_model_len.")
    logger.info("KV cache: %d blocks x %d tokens (%.1f MiB, %s)", num_blocks, cache.block_size,
                num_blocks * per_block / 2**20, " / ".join(f.name for _, f in models))
    return int(num_blocks)


def allocate_kv_caches(model: nn.Module, num_blocks: int, block_size: int, fmt: KVFormat,
                       device: torch.device) -> None:
    """Bind caches of `num_blocks` usable blocks plus the null block 0 to each attention layer,
    in format `fmt`.

    Only the null block is zeroed: padded key positions read it, and a masked-out NaN would still
    poison the attention output (0 * NaN). Every other slot is written before it is read."""
    slots = (num_blocks + 1) * block_size
    for attn in model.attention_layers():
        attn.kv_format = fmt
        for name in ("k_cache", "v_cache"):
            cache = torch.empty(slots, attn.num_kv_heads, fmt.row_elems(attn.head_dim),
                                dtype=fmt.storage, device=device)
            cache[:block_size].view(torch.uint8).zero_()  # zero bytes: 0.0 in every format
            setattr(attn, name, cache)
