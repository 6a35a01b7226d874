"""Mirrors vllm/v1/core/kv_cache_utils.py: KV blocks, the free-block queue and block hashing.

The KV cache is cut into fixed-size blocks of `block_size` token slots. A `KVCacheBlock` is only
metadata (an id, a reference count, an optional content hash); the tensors live in the model
runner. Free blocks sit in a doubly linked list so that a block in the middle can be taken out in
O(1) when a prefix-cache hit revives it, and so that eviction order is least-recently-freed first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mini.seams import register


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one KV block. `eq=False`: two blocks are the same only if they are the same object."""

    block_id: int
    ref_cnt: int = 0
    # Hash of the block's tokens (chained with its prefix) once it is full and cached; None otherwise.
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


def hash_block_tokens(
    parent_block_hash: int | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: Any = None,
) -> int:
    """Hash of one full block, chained with the hash of the block before it.

    Because the parent hash is an input, equal hashes mean equal *prefixes*, not just equal blocks:
    a block's KV depends on every token before it. sha256 keeps the result stable across processes
    (Python's `hash` is salted for str), truncated to 64 bits.
    """
    payload = repr((parent_block_hash, tuple(int(t) for t in curr_block_token_ids), extra_keys))
    digest = hashlib.sha256(payload.encode()).digest()
    return int.from_bytes(digest[:8], "little")


def hash_request_blocks(
    token_ids: Sequence[int], block_size: int, known_hashes: list[int] | None = None
) -> list[int]:
    """Chained hashes of every FULL block of `token_ids`, reusing (and extending) `known_hashes`."""
    hashes = [] if known_hashes is None else known_hashes
    num_full_blocks = len(token_ids) // block_size
    for block_index in range(len(hashes), num_full_blocks):
        parent = hashes[-1] if hashes else None
        start = block_index * block_size
        hashes.append(hash_block_tokens(parent, token_ids[start:start + block_size]))
    return hashes
