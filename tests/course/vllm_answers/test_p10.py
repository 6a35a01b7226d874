"""vLLM v0.33.0's own implementations of phase 10's mirrored functions pass phase 10's checks (issues 24, 26).

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape:
`hash_block_tokens` runs as is; `BlockPool.touch` gets the `metrics_collector` attribute vLLM's pool has;
mini's `hash_request_tokens` (no vLLM function of that shape) is vLLM's request block hasher
(`get_request_block_hasher`, with vLLM's `generate_block_hash_extra_keys`) run on a request stub holding the
token ids, the salt and the known hashes; `KVCacheManager.get_computed_blocks` runs with vLLM's
`FullAttentionManager.find_longest_cache_hit` as its one-group coordinator, on a request view carrying the
block hashes mini's manager computes, and mini's pool seen through vLLM's `get_cached_block(hash, group ids)`;
`BlockPool._maybe_evict_cached_block` (with vLLM's `_remove_cached_block_hashes`) runs on vLLM's own
`BlockHashToBlockMap`, loaded from mini's map and duplicates before the call and written back after it (the
same cache in vLLM's layout: per hash, the oldest block first).

Not adapted: `BlockPool.cache_full_blocks`. vLLM's reads the hashes from the request (at a hash block size
that may differ from the block size), treats a block that already holds a hash as a partial block being
promoted to full (asserting on `KVCacheBlock.block_hash_num_tokens`, which mini's block does not have), and
skips prefix hits through its own `num_cached_block` bookkeeping, where mini passes them in and skips them by
their hash: running it would mean reimplementing that machinery here, not adapting a call.
"""

from __future__ import annotations

import collections.abc
import itertools
import types
import typing
from typing import Any

from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_utils import KVCacheBlock
from mini.utils import cdiv
from tests.course.fidelity import check_of, vllm_definition

PHASE = "10_prefix_caching"
KV_CACHE_UTILS = "vllm/v1/core/kv_cache_utils.py"


def vllm_namespace() -> dict[str, Any]:
    names = {name: getattr(typing, name) for name in ("Any", "ClassVar")}
    names.update({name: getattr(collections.abc, name) for name in ("Callable", "Iterable", "Iterator", "Sequence")})
    return {**names, "KVCacheBlock": KVCacheBlock, "BlockPool": BlockPool, "Request": Any, "BlockHash": bytes,
            "BlockHashList": list, "KVCacheSpec": Any, "NONE_HASH": kv_cache_utils.NONE_HASH,
            "itertools": itertools, "cdiv": cdiv}


def test_vllm_hash_block_tokens_passes():
    check_of(PHASE, "hash_block_tokens")(vllm_definition(KV_CACHE_UTILS, "hash_block_tokens", vllm_namespace()))


def test_vllm_request_block_hasher_passes_as_hash_request_tokens():
    namespace = vllm_namespace()
    for name in ("hash_block_tokens", "generate_block_hash_extra_keys", "_gen_mm_extra_hash_keys",
                 "_gen_lora_extra_hash_keys", "_gen_prompt_embeds_extra_hash_keys", "get_request_block_hasher"):
        vllm_definition(KV_CACHE_UTILS, name, namespace)

    def hash_request_tokens(block_size, token_ids, cache_salt=None, hash_function=kv_cache_utils.sha256,
                            known_hashes=None, *, hash_block_tokens=None):   # vLLM's hasher chains its own
        hashes = [] if known_hashes is None else known_hashes
        request = types.SimpleNamespace(block_hashes=hashes, all_token_ids=list(token_ids), num_tokens=len(token_ids),
                                        cache_salt=cache_salt, mm_features=[], lora_request=None, prompt_embeds=None)
        hashes.extend(namespace["get_request_block_hasher"](block_size, hash_function)(request))
        return hashes

    check_of(PHASE, "hash_request_tokens")(hash_request_tokens)


class _FullAttentionSpec:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size


class _VllmPoolView:
    """mini's pool as vLLM's find_longest_cache_hit reads a pool: one KV-cache group, block-sized hashes."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool, self.hash_block_size = pool, block_size

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        block = self.pool.get_cached_block(block_hash)
        return None if block is None else [block] * len(kv_cache_group_ids)


class FullAttentionManager:
    """`cls` of vLLM's classmethod: the class attribute it reads."""

    supports_fine_grained_hash_lookup = True


def test_vllm_get_computed_blocks_passes():
    namespace = {**vllm_namespace(), "FullAttentionSpec": _FullAttentionSpec,
                 "ChunkedLocalAttentionSpec": _FullAttentionSpec, "KVCacheBlocks": tuple}
    vllm_definition(KV_CACHE_UTILS, "resolve_block_hashes", namespace)
    vllm_find = vllm_definition("vllm/v1/core/single_type_kv_cache_manager.py",
                                "FullAttentionManager.find_longest_cache_hit",
                                namespace)  # the slice drops @classmethod
    vllm_get_computed_blocks = vllm_definition("vllm/v1/core/kv_cache_manager.py",
                                               "KVCacheManager.get_computed_blocks", namespace)

    def get_computed_blocks(self, request):
        pool_view, spec = _VllmPoolView(self.block_pool, self.block_size), _FullAttentionSpec(self.block_size)

        def find_longest_cache_hit(block_hashes, max_cache_hit_length):   # one full-attention group
            (hits,), hit_length = vllm_find(FullAttentionManager, block_hashes, max_cache_hit_length, [0], pool_view,
                                            spec, False, self.block_size)
            return (hits,), hit_length, 0

        manager_view = types.SimpleNamespace(
            prefix_cache_lookup_enabled=self.prefix_cache_lookup_enabled, empty_kv_cache_blocks=([],),
            coordinator=types.SimpleNamespace(find_longest_cache_hit=find_longest_cache_hit),
            enable_kv_cache_events=False, create_kv_cache_blocks=lambda blocks: blocks)
        request_view = types.SimpleNamespace(   # vLLM's Request carries its block hashes; mini's manager keeps them
            block_hashes=self._block_hashes(request), num_tokens=request.num_tokens,
            skip_reading_prefix_cache=request.skip_reading_prefix_cache)
        blocks, num_hit_tokens, _ = vllm_get_computed_blocks(manager_view, request_view)
        return list(blocks[0]), num_hit_tokens

    check_of(PHASE, "get_computed_blocks")(get_computed_blocks)


def test_vllm_touch_passes():
    vllm_touch = vllm_definition("vllm/v1/core/block_pool.py", "BlockPool.touch", vllm_namespace())

    def touch(self, blocks):
        self.__dict__.setdefault("metrics_collector", None)
        return vllm_touch(self, blocks)

    check_of(PHASE, "touch")(touch)


def test_vllm_maybe_evict_cached_block_passes():
    namespace = vllm_namespace()
    block_map_class = vllm_definition("vllm/v1/core/block_pool.py", "BlockHashToBlockMap", namespace)
    vllm_evict = vllm_definition("vllm/v1/core/block_pool.py", "BlockPool._maybe_evict_cached_block", namespace)
    vllm_remove = vllm_definition("vllm/v1/core/block_pool.py", "BlockPool._remove_cached_block_hashes", namespace)

    def _maybe_evict_cached_block(self, block):
        block_map = block_map_class()   # mini's cache in vLLM's layout: per hash, the map's block, then the copies
        for block_hash, first in self.cached_block_hash_to_block.items():
            for cached in [first, *self.duplicate_cached_blocks.get(block_hash, {}).values()]:
                block_map.insert(block_hash, cached)
        pool_view = types.SimpleNamespace(cached_block_hash_to_block=block_map, cached_block_hashes_by_block={},
                                          metrics_collector=None, _emit_block_removed_events=lambda hashes: None)
        pool_view._remove_cached_block_hashes = types.MethodType(vllm_remove, pool_view)
        evicted = vllm_evict(pool_view, block)
        self.cached_block_hash_to_block.clear()
        self.duplicate_cached_blocks.clear()
        for block_hash, cached in block_map._cache.items():
            first, *copies = [cached] if isinstance(cached, KVCacheBlock) else list(cached.values())
            self.cached_block_hash_to_block[block_hash] = first
            if copies:
                self.duplicate_cached_blocks[block_hash] = {copy.block_id: copy for copy in copies}
        return evicted

    check_of(PHASE, "_maybe_evict_cached_block")(_maybe_evict_cached_block)
