"""vLLM v0.33.0's own implementations of phase 10's mirrored functions pass phase 10's checks (issue 24).

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape:
`hash_block_tokens` runs as is; `BlockPool.touch` gets the `metrics_collector` attribute vLLM's pool has;
`FullAttentionManager.find_longest_cache_hit` sees mini's pool through vLLM's `get_cached_block(hash, group ids)`
and one full-attention KV-cache group; mini's `hash_request_tokens` (no vLLM function of that shape) is vLLM's
request block hasher (`get_request_block_hasher`, with vLLM's `generate_block_hash_extra_keys`) run on a
request stub holding the token ids, the salt and the known hashes.
"""

from __future__ import annotations

import collections.abc
import itertools
import types
import typing
from typing import Any

from course_fidelity import check_of, vllm_definition

from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_utils import KVCacheBlock
from mini.utils import cdiv

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
                            known_hashes=None):
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


def test_vllm_find_longest_cache_hit_passes():
    namespace = {**vllm_namespace(), "FullAttentionSpec": _FullAttentionSpec,
                 "ChunkedLocalAttentionSpec": _FullAttentionSpec}
    vllm_definition(KV_CACHE_UTILS, "resolve_block_hashes", namespace)
    vllm_find = vllm_definition("vllm/v1/core/single_type_kv_cache_manager.py",
                                "FullAttentionManager.find_longest_cache_hit", namespace)  # the slice drops @classmethod

    def find_longest_cache_hit(block_hashes, max_cache_hit_length, block_pool, block_size):
        (hits,), _ = vllm_find(FullAttentionManager, block_hashes, max_cache_hit_length, [0], _VllmPoolView(block_pool, block_size),
                               _FullAttentionSpec(block_size), False, block_size)
        return hits

    check_of(PHASE, "find_longest_cache_hit")(find_longest_cache_hit)


def test_vllm_touch_passes():
    vllm_touch = vllm_definition("vllm/v1/core/block_pool.py", "BlockPool.touch", vllm_namespace())

    def touch(self, blocks):
        self.__dict__.setdefault("metrics_collector", None)
        return vllm_touch(self, blocks)

    check_of(PHASE, "touch")(touch)
