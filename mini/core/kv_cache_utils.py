"""Mirrors vllm/v1/core/kv_cache_utils.py: KV blocks, the free-block queue and block hashing.

The KV cache is cut into fixed-size blocks of `block_size` token slots. A `KVCacheBlock` is only
metadata (an id, a reference count, an optional content hash); the tensors live in the model
runner. Free blocks sit in a doubly linked list so that a block in the middle can be taken out in
O(1) when a prefix-cache hit revives it, and so that eviction order is least-recently-freed first.

Prefix caching names a FULL block by a chained hash: `hash_block_tokens(parent_hash, tokens,
extra_keys)`, where `parent_hash` is the previous block's hash (`NONE_HASH` for the first block), so
equal hashes mean equal prefixes. `extra_keys` carries what else changes the KV: in mini only the
request's `cache_salt`, which vLLM puts in the FIRST block's extra keys
(`generate_block_hash_extra_keys`), so that the whole chain of a salted request differs.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mini.seams import register, seam


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one KV block. `eq=False`: two blocks are the same only if they are the same object."""

    block_id: int
    ref_cnt: int = 0
    # Hash of the block's tokens (chained with its prefix) once it is full and cached; None otherwise.
    # It stays set after the block is freed (lazy eviction) until the block is popped for reuse.
    block_hash: int | None = None
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)
    # Block 0 is the null block: a placeholder that is never handed out.
    is_null: bool = False

    def reset_hash(self) -> None:
        self.block_hash = None


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks; the head is evicted first (LRU), freed blocks join the tail.

    Two sentinel nodes (a fake head and a fake tail) mean no operation ever checks for an empty
    neighbour. All operations are O(1) except the `_n` variants, which are O(n).
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        """Take the block at the head (the least recently freed one)."""
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("no free blocks: popleft() on an empty FreeKVCacheBlockQueue")
        self.remove(first)
        return first

    def popleft_n(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"num_blocks must be <= num_free_blocks ({self.num_free_blocks}), got {num_blocks}")
        return [self.popleft() for _ in range(num_blocks)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue in O(1)."""
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (it will be evicted last)."""
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (next to evict) to tail."""
        result = []
        node = self.fake_free_list_head.next_free_block
        while node is not None and node is not self.fake_free_list_tail:
            result.append(node)
            node = node.next_free_block
        return result


register("FreeKVCacheBlockQueue", FreeKVCacheBlockQueue)


def sha256(input_object: Any) -> int:
    """sha256 of the pickled object, as an int (vLLM: `vllm.utils.sha256`). Stable across processes."""
    payload = pickle.dumps(input_object, protocol=pickle.HIGHEST_PROTOCOL)
    return int.from_bytes(hashlib.sha256(payload).digest(), byteorder="big")


# The engine arg `prefix_caching_hash_algo` picks one of these (vLLM: CacheConfig.prefix_caching_hash_algo).
HASH_FUNCTIONS: dict[str, Callable[[Any], int]] = {"builtin": hash, "sha256": sha256}


def get_hash_function(hash_algo: str) -> Callable[[Any], int]:
    if hash_algo not in HASH_FUNCTIONS:
        raise ValueError(f"prefix_caching_hash_algo must be one of {tuple(HASH_FUNCTIONS)}, got {hash_algo!r}")
    return HASH_FUNCTIONS[hash_algo]


# The parent hash of a request's first block. As in vLLM's kv_cache_utils.py: random per process (so
# hashes cannot be predicted from outside), unless PYTHONHASHSEED is set, which makes it reproducible.
NONE_HASH: int = (int.from_bytes(os.urandom(32), byteorder="big") if os.getenv("PYTHONHASHSEED") is None
                  else sha256(os.getenv("PYTHONHASHSEED")))


@seam("hash_block_tokens")
def hash_block_tokens(
    parent_block_hash: int | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    hash_function: Callable[[Any], int] = hash,
) -> int:
    """Hash of one full block, chained with the hash of the block before it.

    `hash_function((parent, tuple(token ids), extra_keys))`, with `NONE_HASH` as the parent of a first
    block (`parent_block_hash=None`). Because the parent hash is an input, equal hashes mean equal
    *prefixes*, not just equal blocks: a block's KV depends on every token before it.
    Mirrors `hash_block_tokens` in vllm/v1/core/kv_cache_utils.py.
    """
    if parent_block_hash is None:
        parent_block_hash = NONE_HASH
    return hash_function((parent_block_hash, tuple(int(t) for t in curr_block_token_ids), extra_keys))


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple[Any, ...] | None:
    """Extra hash keys of block `block_index`: the cache salt goes into the first block only.

    vLLM's `generate_block_hash_extra_keys` also adds LoRA and multimodal keys; mini has neither.
    """
    if block_index == 0 and cache_salt:
        return (cache_salt,)
    return None


@seam("hash_request_tokens")
def hash_request_tokens(
    block_size: int,
    token_ids: Sequence[int],
    cache_salt: str | None = None,
    hash_function: Callable[[Any], int] = hash,
    known_hashes: list[int] | None = None,
) -> list[int]:
    """Chained hashes of every FULL block of `token_ids` (a partial last block gets none).

    `known_hashes` (the hashes already computed for this request, a prefix of the answer) is extended
    in place and returned, so a growing request hashes each block once, as vLLM's request block
    hasher does (vllm/v1/core/kv_cache_utils.py: `get_request_block_hasher`, formerly
    `hash_request_tokens`).
    """
    hashes = [] if known_hashes is None else known_hashes
    for block_index in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        start = block_index * block_size
        hashes.append(hash_block_tokens(parent, token_ids[start:start + block_size],
                                        block_extra_keys(block_index, cache_salt), hash_function))
    return hashes
