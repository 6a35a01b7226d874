"""Mirrors vllm/v1/core/kv_cache_utils.py: KV blocks, the free-block queue and block hashing.

The KV cache is cut into fixed-size blocks of `block_size` token slots. A `KVCacheBlock` is only
metadata (an id, a reference count, an optional content hash); the tensors live in the model
runner. Free blocks sit in a doubly linked list so that a block in the middle can be taken out in
O(1) when a prefix-cache hit revives it, and so that eviction order is least-recently-freed first.

Prefix caching names a FULL block by a chained hash: `hash_block_tokens(hash_function, parent_hash,
tokens, extra_keys)`, where `parent_hash` is the previous block's hash (`NONE_HASH` for the first block),
so equal hashes mean equal prefixes. A hash is `bytes` (a sha256 digest), as vLLM's `BlockHash`.
`extra_keys` carries what else changes the KV: in mini only the request's `cache_salt`, which vLLM puts
in the FIRST block's extra keys as `("cache_salt", salt)` (`generate_block_hash_extra_keys`), so that the
whole chain of a salted request differs.

The hash functions and their names are vLLM's (`vllm/utils/hashing.py`, the engine argument
`prefix_caching_hash_algo` in `vllm/config/cache.py`): "sha256" (pickle + SHA-256, the default),
"sha256_cbor" (canonical CBOR + SHA-256, needs `cbor2`), "xxhash" and "xxhash_cbor" (xxHash3-128, need
`xxhash`). `init_none_hash(hash_function)` seeds `NONE_HASH` as `vllm/v1/core/kv_cache_utils.py` does.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one KV block. `eq=False`: two blocks are the same only if they are the same object."""

    block_id: int
    ref_cnt: int = 0
    # Hash of the block's tokens (chained with its prefix) once it is full and cached; None otherwise.
    # It stays set after the block is freed (lazy eviction) until the block is popped for reuse.
    block_hash: bytes | None = None
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)
    # Block 0 is the null block: a placeholder that is never handed out.
    is_null: bool = False

    def reset_hash(self) -> None:
        self.block_hash = None


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks; the head is handed out (and evicted) first.

    `BlockPool.free_blocks` appends cached blocks to the tail (LRU eviction) and prepends blocks that
    hold no hash to the head (reused first). Two sentinel nodes (a fake head and a fake tail) mean no
    operation ever checks for an empty neighbour. All operations are O(1) except the `_n` variants,
    which are O(n).
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
        """Put blocks at the tail, in order (the last one is evicted last)."""
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put blocks at the head, in order: `blocks[0]` becomes the head (handed out next)."""
        after = self.fake_free_list_head
        for block in blocks:
            if block.prev_free_block is not None or block.next_free_block is not None:
                raise ValueError(f"block {block.block_id} is already in the free queue")
            before_next = after.next_free_block
            assert before_next is not None
            block.prev_free_block, block.next_free_block = after, before_next
            after.next_free_block = block
            before_next.prev_free_block = block
            self.num_free_blocks += 1
            after = block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (next to evict) to tail."""
        result = []
        node = self.fake_free_list_head.next_free_block
        while node is not None and node is not self.fake_free_list_tail:
            result.append(node)
            node = node.next_free_block
        return result


def sha256(input_object: Any) -> bytes:
    """SHA-256 digest of the pickled object (vLLM: `sha256` in vllm/utils/hashing.py)."""
    payload = pickle.dumps(input_object, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(payload).digest()


def _optional_module(name: str, algo: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ValueError(f"prefix_caching_hash_algo={algo!r} needs the {name!r} package, which is not "
                         f"installed (pip install {name}); 'sha256' needs nothing") from None


def sha256_cbor(input_object: Any) -> bytes:
    """SHA-256 digest of the canonical CBOR encoding (vLLM: `sha256_cbor`); needs the cbor2 package."""
    cbor2 = _optional_module("cbor2", "sha256_cbor")
    return hashlib.sha256(cbor2.dumps(input_object, canonical=True)).digest()


def xxhash(input_object: Any) -> bytes:
    """xxHash3-128 digest of the pickled object (vLLM: `xxhash`); needs the xxhash package."""
    module = _optional_module("xxhash", "xxhash")
    return module.xxh3_128_digest(pickle.dumps(input_object, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input_object: Any) -> bytes:
    """xxHash3-128 digest of the canonical CBOR encoding (vLLM: `xxhash_cbor`); needs cbor2 and xxhash."""
    cbor2 = _optional_module("cbor2", "xxhash_cbor")
    return _optional_module("xxhash", "xxhash_cbor").xxh3_128_digest(cbor2.dumps(input_object, canonical=True))


# `prefix_caching_hash_algo` picks one of these (vLLM: CacheConfig.prefix_caching_hash_algo, default "sha256").
HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": sha256, "sha256_cbor": sha256_cbor, "xxhash": xxhash, "xxhash_cbor": xxhash_cbor}
_OPTIONAL_PACKAGES = {"sha256_cbor": ("cbor2",), "xxhash": ("xxhash",), "xxhash_cbor": ("cbor2", "xxhash")}
# Not collision resistant: their NONE_HASH seed must stay secret (random per process), as in vLLM.
_NON_CRYPTO_HASH_FUNCTIONS = frozenset({xxhash, xxhash_cbor})


def get_hash_function(hash_algo: str) -> Callable[[Any], bytes]:
    """The hash function named `hash_algo` (vLLM: `get_hash_fn_by_name`); a ValueError names the allowed
    values, or the package an algorithm needs when it is not installed."""
    if hash_algo not in HASH_FUNCTIONS:
        raise ValueError(f"prefix_caching_hash_algo must be one of {tuple(HASH_FUNCTIONS)}, got {hash_algo!r}")
    for package in _OPTIONAL_PACKAGES.get(hash_algo, ()):
        _optional_module(package, hash_algo)
    return HASH_FUNCTIONS[hash_algo]


# The seed NONE_HASH is derived from when PYTHONHASHSEED is unset and the hash is cryptographic.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def resolve_none_hash_seed(hash_function: Callable[[Any], bytes]) -> str:
    """PYTHONHASHSEED if set; else a fixed seed for sha256 (so processes share hashes) or a random one for
    the non-cryptographic xxhash (so collisions cannot be precomputed). vLLM: `resolve_none_hash_seed`."""
    seed = os.getenv("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if hash_function in _NON_CRYPTO_HASH_FUNCTIONS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


# The parent hash of a request's first block: `hash_function(seed)`, set by `init_none_hash` (the engine
# calls it with its `prefix_caching_hash_algo`, as vLLM's EngineCore does); sha256 until then.
NONE_HASH: bytes


def init_none_hash(hash_function: Callable[[Any], bytes]) -> None:
    """Seed `NONE_HASH` for `hash_function` (vLLM: `init_none_hash` in vllm/v1/core/kv_cache_utils.py)."""
    global NONE_HASH
    NONE_HASH = hash_function(resolve_none_hash_seed(hash_function))


init_none_hash(sha256)


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: bytes | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """Hash of one full block, chained with the hash of the block before it.

    `hash_function((parent, tuple(token ids), extra_keys))`, with `NONE_HASH` as the parent of a first
    block (`parent_block_hash=None`). Because the parent hash is an input, equal hashes mean equal
    *prefixes*, not just equal blocks: a block's KV depends on every token before it.
    Mirrors `hash_block_tokens` in vllm/v1/core/kv_cache_utils.py (same argument order).
    """
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple[Any, ...] | None:
    """Extra hash keys of block `block_index`: `("cache_salt", salt)` in the first block only.

    vLLM's `generate_block_hash_extra_keys` also adds LoRA, multimodal and prompt-embeds keys; mini has none.
    """
    if block_index == 0 and cache_salt:
        return (("cache_salt", cache_salt),)
    return None


def lora_cache_salt(cache_salt: str | None, lora_request: Any) -> str | None:
    """The namespace a request's first block hashes under: its `cache_salt`, joined with its LoRA adapter.

    vLLM adds `("lora", lora_name, lora_path)` to the extra keys of every block (`_gen_lora_extra_hash_keys`
    in vllm/v1/core/kv_cache_utils.py), so the same prompt under two adapters (or none) never shares a block:
    the KV of every layer differs. mini folds the adapter into the first block's salt key instead, which keeps
    `hash_request_tokens`' signature (a course exercise); the parent chain carries it to every later block.
    """
    if lora_request is None:
        return cache_salt
    return f"{cache_salt or ''}\x00lora:{lora_request.lora_int_id}:{lora_request.lora_name}:{lora_request.lora_path}"


def hash_request_tokens(
    block_size: int,
    token_ids: Sequence[int],
    cache_salt: str | None = None,
    hash_function: Callable[[Any], bytes] = sha256,
    known_hashes: list[bytes] | None = None,
    *,
    hash_block_tokens: Callable[..., bytes] = hash_block_tokens,
) -> list[bytes]:
    """Chained hashes of every FULL block of `token_ids` (a partial last block gets none).

    `known_hashes` (the hashes already computed for this request, a prefix of the answer) is extended
    in place and returned, so a growing request hashes each block once, as vLLM's request block
    hasher does (`get_request_block_hasher` in vllm/v1/core/kv_cache_utils.py, which appends to
    `Request.block_hashes`). mini's own function: vLLM has no function of this shape. The block hash it
    chains is a parameter, so an engine built with another `hash_block_tokens` (mini/roles.py) uses it.
    """
    hashes = [] if known_hashes is None else known_hashes
    for block_index in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        start = block_index * block_size
        hashes.append(hash_block_tokens(hash_function, parent, token_ids[start:start + block_size],
                                        block_extra_keys(block_index, cache_salt)))
    return hashes
