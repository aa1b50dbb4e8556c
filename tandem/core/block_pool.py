"""Block pool: fixed-size KV blocks with reference counts and a prefix cache of full blocks.

Block 0 is the null block: never handed out, always zero. Attention pads key lists with its slots, so
the KV tensors need no zero-fill (allocating gigabytes of zeros is slow). Free blocks sit in an LRU
queue. A freed block that holds a cached prefix keeps its hash, so a
later request with the same prefix can revive it; it is evicted only when its id is handed out anew.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[bytes] = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        """`num_blocks` usable blocks, ids 1..num_blocks (0 is the null block)."""
        self.blocks = [KVBlock(i) for i in range(num_blocks + 1)]
        self.enable_caching = enable_caching
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        """Usable blocks (the null block excluded)."""
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > len(self.free_queue):
            raise RuntimeError(f"Cannot get {n} free blocks from the pool ({len(self.free_queue)})")
        out = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)  # least recently freed first
            if block.block_hash is not None:
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def get_cached_block(self, block_hash: bytes) -> Optional[KVBlock]:
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on prefix-cache hits (reviving free ones)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.pop(block.block_id)
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference each; pass blocks tail-first so a prefix's tail is evicted first."""
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        self.cached.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, if no block is in use (vLLM's rule: a running request's
        blocks may be shared, so their hashes cannot be dropped under it). Returns whether it
        did."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True
