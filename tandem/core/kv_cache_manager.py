"""KV cache manager: which blocks each request holds, prefix-cache lookups, allocation.

The target and the draft share these decisions: both models' KV tensors are indexed by the same
block ids. A draft with the target's tokenizer reads the target's blocks (one allocation covers
both). A draft with another tokenizer (TLI) has positions of its own, so it gets blocks of its own
from the same pool; they are optional memory: allocated only when the pool can spare them, and
the first thing reclaimed when the target needs room. Freeing a request frees both.
"""

from __future__ import annotations

import hashlib
from array import array

from tandem.core.block_pool import BlockPool, KVBlock
from tandem.core.request import Request


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent: bytes, tokens: list[int]) -> bytes:
    """Chained hash of a full block: equal hashes mean equal whole prefixes."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.draft_blocks: dict[str, list[KVBlock]] = {}  # TLI drafts only
        self.prefix_queries = 0   # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0      # of which found

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def block_table(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, ())]

    def _update_hashes(self, req: Request, num_tokens: int) -> None:
        bs = self.block_size
        while len(req.block_hashes) < num_tokens // bs:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if i else b""
            req.block_hashes.append(hash_block(parent, req.all_token_ids[i * bs:(i + 1) * bs]))

    def get_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of full blocks; at least one token is always left to compute so
        the last position produces logits."""
        if not self.enable_caching or req.params.prompt_logprobs is not None:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        self._update_hashes(req, max_blocks * self.block_size)
        hits: list[KVBlock] = []
        for h in req.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            hits.append(block)
        self.prefix_queries += req.num_tokens
        self.prefix_hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int, num_lookahead_tokens: int = 0,
                       new_computed_blocks: list[KVBlock] | None = None,
                       reserve: int = 0) -> bool:
        """Make room for `num_new_tokens` after the computed ones, plus lookahead slots the draft
        writes into, leaving at least `reserve` blocks free. Returns False (allocating nothing)
        when the pool is short."""
        new_computed_blocks = new_computed_blocks or []
        blocks = self.req_blocks.setdefault(req.request_id, [])
        total = (req.num_computed_tokens + len(new_computed_blocks) * self.block_size
                 + num_new_tokens + num_lookahead_tokens)
        need = _cdiv(total, self.block_size) - len(blocks) - len(new_computed_blocks)
        revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if need + reserve > self.pool.num_free_blocks - revived:
            if not blocks:
                del self.req_blocks[req.request_id]
            return False
        self.pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        if need > 0:
            blocks.extend(self.pool.get_new_blocks(need))
        return True

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register the request's full blocks among its first `num_tokens` (whose KV is final)."""
        if not self.enable_caching or req.params.prompt_logprobs is not None:
            return
        blocks = self.req_blocks.get(req.request_id, [])
        num_full = min(num_tokens // self.block_size, len(blocks))
        start = self.num_cached_blocks.get(req.request_id, 0)
        if num_full <= start:
            return
        self._update_hashes(req, num_full * self.block_size)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], req.block_hashes[i])
        self.num_cached_blocks[req.request_id] = num_full

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache when no request holds a block (BlockPool.reset_prefix_cache)."""
        return self.pool.reset_prefix_cache()

    def free(self, req: Request) -> None:
        blocks = self.req_blocks.pop(req.request_id, [])
        self.num_cached_blocks.pop(req.request_id, None)
        self.pool.free_blocks(list(reversed(blocks)))
        self.free_draft(req.request_id)

    # -- the draft's own blocks (TLI) ------------------------------------------------------------
    def draft_block_table(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.draft_blocks.get(request_id, ())]

    def allocate_draft_slots(self, request_id: str, num_positions: int, reserve: int) -> bool:
        """Blocks for the draft's first `num_positions` positions, if at least `reserve` free
        blocks remain afterwards for the target's growth. Returns False (allocating nothing)
        otherwise."""
        blocks = self.draft_blocks.setdefault(request_id, [])
        need = _cdiv(num_positions, self.block_size) - len(blocks)
        if need > 0:
            if need > self.pool.num_free_blocks - reserve:
                return False
            blocks.extend(self.pool.get_new_blocks(need))
        return True

    def free_draft(self, request_id: str) -> int:
        """Free a request's draft blocks; returns how many."""
        blocks = self.draft_blocks.pop(request_id, [])
        self.pool.free_blocks(list(reversed(blocks)))
        return len(blocks)
