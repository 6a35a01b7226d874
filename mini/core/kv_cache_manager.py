"""Mirrors vllm/v1/core/kv_cache_manager.py: which blocks each request holds.

The scheduler talks to KV memory only through this class: `get_computed_blocks` (prefix-cache
hits for a new request), `allocate_slots` (enough blocks for the tokens about to be computed, or
None when the pool is too small: then the scheduler preempts someone) and `free`. A request's
blocks always cover `request.num_computed_tokens + num_new_tokens` tokens.
"""

from __future__ import annotations

from typing import Any

from mini import roles
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_utils import KVCacheBlock
from mini.core.request import Request
from mini.metrics.stats import PrefixCacheStats
from mini.utils import cdiv


def find_longest_cache_hit(
    block_hashes: list[bytes], max_cache_hit_length: int, block_pool: BlockPool, block_size: int
) -> list[KVCacheBlock]:
    """The cached blocks of the longest run of leading block hashes, holding at most `max_cache_hit_length`
    tokens. Stops at the first miss: a block can only be reused if every block before it is too.

    Nothing changes here (no ref counts): the hits only become a request's when `allocate_slots`
    accepts them. Mirrors `FullAttentionManager.find_longest_cache_hit`
    (vllm/v1/core/single_type_kv_cache_manager.py).
    """
    max_num_blocks = max_cache_hit_length // block_size
    hits: list[KVCacheBlock] = []
    for block_hash in block_hashes[:max_num_blocks]:
        block = block_pool.get_cached_block(block_hash)
        if block is None:
            break
        hits.append(block)
    return hits


class KVCacheManager:
    """Block tables of all requests, on top of one `BlockPool`.

    Home of the `kv_cache` role's manager parts (mini/roles.py): `allocate_slots`, the prefix-cache lookup
    `get_computed_blocks` and the two hash functions; `config` (the engine's EngineConfig; its `parts`,
    mini/roles.py) picks the pool's class.
    """

    hash_block_tokens = staticmethod(kv_cache_utils.hash_block_tokens)
    hash_request_tokens = staticmethod(kv_cache_utils.hash_request_tokens)

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = False,
                 hash_algo: str = "sha256", config: Any = None) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_function = kv_cache_utils.get_hash_function(hash_algo)
        if enable_caching:  # vLLM's EngineCore seeds NONE_HASH for the chosen algorithm
            kv_cache_utils.init_none_hash(self.hash_function)
        # Lookups and hits since the start (or the last reset); vLLM: `KVCacheManager.prefix_cache_stats`.
        self.prefix_cache_stats = PrefixCacheStats()
        self.block_pool = roles.resolve(config, BlockPool)(num_gpu_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Prefix caching: how many leading blocks of each request are registered in the cache, and
        # the chained hashes of its full blocks (extended as the request grows).
        self.num_cached_block: dict[str, int] = {}
        self.req_to_block_hashes: dict[str, list[bytes]] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def num_usable_tokens(self) -> int:
        """The token slots the pool can hand out (every block but the null block)."""
        return self.block_pool.num_usable_blocks * self.block_size

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` token slots."""
        return cdiv(num_tokens, self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def _block_hashes(self, request: Request) -> list[bytes]:
        """The request's full-block hash chain, extended to its current tokens (each block hashed once)."""
        known = self.req_to_block_hashes.setdefault(request.request_id, [])
        hashes = self.hash_request_tokens(
            self.block_size, request.all_token_ids,
            kv_cache_utils.lora_cache_salt(request.cache_salt, getattr(request, "lora_request", None)),
            self.hash_function, known)
        self.req_to_block_hashes[request.request_id] = hashes
        return hashes

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether this request may read the prefix cache: caching is on and the request does not skip it
        (one asking for prompt logprobs does: its hits would have no logprobs). vLLM: same name."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached leading full blocks, and how many tokens they hold.

        At most `num_tokens - 1` tokens can hit: the last token is always computed, to get the logits
        of the next one (so a fully cached prompt recomputes its last block). Nothing changes here:
        the hits only become the request's when `allocate_slots` accepts them, and the scheduler
        counts the lookup (`record_prefix_cache_stats`) only then, as vLLM's does. A request that
        skips reading the cache gets no hits.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return [], 0
        hits = find_longest_cache_hit(self._block_hashes(request), request.num_tokens - 1, self.block_pool,
                                      self.block_size)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count one admitted request's lookup (a request that skipped the cache is not counted).

        vLLM's scheduler calls `KVCacheManager.record_prefix_cache_stats` once per admission, after
        `allocate_slots` succeeds, so a request that waits several steps is counted once; a request
        resumed after preemption goes to the `preempted_*` counters.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (False, changing nothing, while a block is in use); resets the counters."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats = PrefixCacheStats(reset=True)
        return True

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Grow the request's blocks to hold its computed tokens, the prefix hits and `num_new_tokens`.

        Returns the newly allocated blocks (maybe []), or None, with nothing changed, when the pool
        has too few free blocks.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        new_computed_blocks = list(new_computed_blocks or [])
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        num_blocks_to_allocate = max(
            0, self.num_blocks_needed(num_tokens_need_slot) - len(req_blocks) - len(new_computed_blocks))
        # Hits that sit in the free queue stop being free once touched.
        num_evictable_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_blocks_to_allocate > self.block_pool.get_num_free_blocks() - num_evictable_hits:
            if not req_blocks:
                del self.req_to_blocks[request.request_id]
            return None

        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_blocks_to_allocate)
        req_blocks.extend(new_blocks)

        if self.enable_caching:
            # Cache every block whose tokens are all known (vLLM caches at schedule time: the KV of
            # these tokens is written in this step's forward pass, before anyone can read it).
            num_tokens_to_cache = min(num_tokens_need_slot, request.num_tokens)
            num_full_blocks = num_tokens_to_cache // self.block_size
            num_cached = self.num_cached_block.get(request.request_id, 0)
            if num_full_blocks > num_cached:
                hashes = self._block_hashes(request)
                self.block_pool.cache_full_blocks(req_blocks, hashes, num_cached, num_full_blocks)
                self.num_cached_block[request.request_id] = num_full_blocks
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks among its first `num_tokens` tokens that are known and not cached yet
        (vLLM: `KVCacheManager.cache_blocks`). Async scheduling calls it once a step's sampled token is known: at
        allocation that token was still a placeholder, so its block could not be hashed then."""
        if not self.enable_caching or request.request_id not in self.req_to_blocks:
            return
        num_full_blocks = min(num_tokens, request.num_tokens) // self.block_size
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_full_blocks > num_cached:
            self.block_pool.cache_full_blocks(self.req_to_blocks[request.request_id], self._block_hashes(request),
                                              num_cached, num_full_blocks)
            self.num_cached_block[request.request_id] = num_full_blocks

    def free(self, request: Request | str) -> None:
        """Release the request's blocks, last block first (vLLM: `SingleTypeKVCacheManager.free`). Idempotent."""
        request_id = request if isinstance(request, str) else request.request_id
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def uncache_uncomputed_blocks(self, request: Request) -> None:
        """Drop the hashes of blocks whose tokens are not all computed yet.

        Blocks are cached when they are scheduled. If a request is preempted in the same step,
        after it was scheduled, its new blocks were never written: they must not become hits.
        """
        blocks = self.req_to_blocks.get(request.request_id, [])
        for block in blocks[request.num_computed_tokens // self.block_size:]:
            self.block_pool._maybe_evict_cached_block(block)

    def forget_request(self, request_id: str) -> None:
        """Drop per-request hash bookkeeping once the request is finished for good."""
        self.req_to_block_hashes.pop(request_id, None)
