"""Mirrors vllm/v1/core/block_pool.py: every KV block, the free queue, ref counts and the prefix cache.

Block 0 is the null block (a placeholder, never handed out), so a fresh pool of `num_gpu_blocks`
hands out blocks 1, 2, 3, ... in order. A block in use has `ref_cnt >= 1` (more than 1 when several
requests share a cached prefix). When its count drops to 0 it goes back to the free queue: a block
holding no hash (or any block when prefix caching is off) to the HEAD, so it is reused first; a
cached block to the TAIL, keeping its hash, so a later request with the same prefix can revive it
(`touch`) until the block reaches the head and is popped for reuse, which drops its hash (lazy
eviction, least recently freed first).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from mini.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock


def usable_blocks(num_gpu_blocks: int) -> int:
    """The blocks a pool of `num_gpu_blocks` can hand out: all but the null block (block 0)."""
    return num_gpu_blocks - 1


class BlockPool:
    """Owns all `KVCacheBlock`s of the cache.

    Home of the `kv_cache` role's pool parts (mini/roles.py): the free queue's class, `get_new_blocks`,
    `free_blocks`, `touch` and the two halves of lazy eviction, `cache_full_blocks` (publish) and
    `_maybe_evict_cached_block` (evict on reuse); an engine built with other parts uses a subclass holding them.
    """

    FreeKVCacheBlockQueue: ClassVar[type[FreeKVCacheBlockQueue]] = FreeKVCacheBlockQueue

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be an int >= 2 (block 0 is the null block), got {num_gpu_blocks!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
        self.free_block_queue: FreeKVCacheBlockQueue = self.FreeKVCacheBlockQueue(self.blocks)
        # The null block is the first one popped, so it is never in the free queue afterwards.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # Prefix cache: block hash -> the block a hit resolves to (in use or free-but-not-evicted).
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}
        # Two requests that computed the same prefix in the same step hold two blocks with one hash. vLLM
        # keeps {block_id: block} per hash (`BlockHashToBlockMap`) and a hit takes the oldest; mini keeps
        # that oldest in the map above and the later ones here, promoted when the oldest is evicted.
        self.duplicate_cached_blocks: dict[bytes, dict[int, KVCacheBlock]] = {}

    @property
    def num_usable_blocks(self) -> int:
        """The blocks this pool can hand out: all but the null block."""
        return usable_blocks(self.num_gpu_blocks)

    def get_num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free, including cached blocks nobody uses)."""
        return self.free_block_queue.num_free_blocks

    def free_block_ids(self) -> list[int]:
        """The free queue's block ids, head (next to hand out) to tail."""
        return [block.block_id for block in self.free_block_queue.get_all_free_blocks()]

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) that are in use."""
        usable = self.num_usable_blocks
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue, evicting their cached hashes; ref_cnt = 1."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"num_blocks must be <= the free blocks ({self.get_num_free_blocks()}), got {num_blocks}")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, f"block {block.block_id} was free with ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop the block's hash from the prefix cache (its slots are about to be overwritten).

        Same name as vLLM's `BlockPool._maybe_evict_cached_block`. Returns True if the block had a hash.
        """
        block_hash = block.block_hash
        if block_hash is None:
            return False
        duplicates = self.duplicate_cached_blocks.get(block_hash, {})
        if self.cached_block_hash_to_block.get(block_hash) is block:
            del self.cached_block_hash_to_block[block_hash]
            if duplicates:  # the next oldest copy takes over
                self.cached_block_hash_to_block[block_hash] = duplicates.pop(next(iter(duplicates)))
        else:
            duplicates.pop(block.block_id, None)
        if not duplicates:
            self.duplicate_cached_blocks.pop(block_hash, None)
        block.reset_hash()
        return True

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference of each block (the null block is skipped: its count is not kept).

        Blocks reaching 0 go back to the free queue in the order given: those without a hash (every
        block when caching is off) to the HEAD (`prepend_n`: reused first, LIFO), the cached ones to the
        TAIL (`append_n`: evicted last, LRU). Callers pass a request's blocks in REVERSE order, so its
        last blocks come first and its prefix (the part most likely to be shared) stays cached longest.
        As vLLM's `BlockPool.free_blocks`; mini also refuses a double free (vLLM does not check).
        """
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise ValueError(f"double free: block {block.block_id} already has ref_cnt 0")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on each prefix-cache hit; a hit that was free leaves the free queue.

        A block with ref_cnt 0 sits in the free queue (cached but evictable): touching it makes it
        unevictable again. The null block is skipped. vLLM: `BlockPool.touch`.
        """
        for block in blocks:
            if block.is_null:
                continue  # never in the free queue, and its ref_cnt is not kept
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """The block holding these tokens (the oldest copy when several do), or None. vLLM: `get_cached_block`."""
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_full_blocks(
        self, blocks: list[KVCacheBlock], block_hashes: list[bytes], num_cached_blocks: int, num_full_blocks: int
    ) -> None:
        """Register blocks [num_cached_blocks, num_full_blocks) of a request under their chained hashes.

        Two requests that computed the same prefix in the same step each hold their own copy: both are
        registered under the hash (vLLM keeps a {block_id: block} dict per hash), and a hit takes the oldest.
        """
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            if block.block_hash is not None:
                continue  # already cached (a prefix hit)
            block.block_hash = block_hashes[index]
            if block.block_hash in self.cached_block_hash_to_block:
                self.duplicate_cached_blocks.setdefault(block.block_hash, {})[block.block_id] = block
            else:
                self.cached_block_hash_to_block[block.block_hash] = block

    def cached_blocks(self) -> list[KVCacheBlock]:
        """Every block registered in the prefix cache (in use or free-but-not-evicted), by block id."""
        blocks = list(self.cached_block_hash_to_block.values())
        for duplicates in self.duplicate_cached_blocks.values():
            blocks.extend(duplicates.values())
        return sorted(blocks, key=lambda block: block.block_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use, as in vLLM."""
        if self.get_num_free_blocks() != self.num_usable_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        self.duplicate_cached_blocks.clear()
        for block in self.blocks:
            block.reset_hash()
        return True
