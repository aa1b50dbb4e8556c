"""Sizing and allocating the paged KV tensors for the target and (optionally) the draft model.

Every attention layer of every model gets its own [num_slots, Hkv, D] key and value tensors with
the same number of slots, so one block id means the same slots in all of them.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from tandem.config import DEFAULT_CPU_KV_CACHE_BYTES, CacheConfig

logger = logging.getLogger("tandem")


def bytes_per_block(models: list[nn.Module], block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return sum(2 * block_size * a.num_kv_heads * a.head_dim * elem
               for m in models for a in m.attention_layers())


def determine_num_blocks(models: list[nn.Module], cache: CacheConfig, dtype: torch.dtype,
                         device: torch.device, max_model_len: int, max_num_seqs: int,
                         lookahead: int) -> int:
    per_block = bytes_per_block(models, cache.block_size, dtype)
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
    logger.info("KV cache: %d blocks x %d tokens (%.1f MiB)", num_blocks, cache.block_size,
                num_blocks * per_block / 2**20)
    return int(num_blocks)


def allocate_kv_caches(model: nn.Module, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> None:
    """Bind caches of `num_blocks` usable blocks plus the null block 0 to each attention layer.

    Only the null block is zeroed: padded key positions read it, and a masked-out NaN would still
    poison the attention output (0 * NaN). Every other slot is written before it is read."""
    slots = (num_blocks + 1) * block_size
    for attn in model.attention_layers():
        for name in ("k_cache", "v_cache"):
            cache = torch.empty(slots, attn.num_kv_heads, attn.head_dim, dtype=dtype, device=device)
            cache[:block_size].zero_()
            setattr(attn, name, cache)
