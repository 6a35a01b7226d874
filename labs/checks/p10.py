"""Checks for phase 10 (prefix caching), against mini.core.

    check_hash_block_tokens(hash_block_tokens)           vs mini.core.kv_cache_utils.hash_block_tokens
    check_hash_request_tokens(hash_request_tokens)       vs mini.core.kv_cache_utils.hash_request_tokens
    check_find_longest_cache_hit(find_longest_cache_hit) vs mini.core.kv_cache_manager.find_longest_cache_hit
    check_touch(touch)                                   vs mini.core.block_pool.BlockPool.touch

vLLM v0.33.0's own `hash_block_tokens` (vllm/v1/core/kv_cache_utils.py), `BlockPool.touch`
(vllm/v1/core/block_pool.py), `FullAttentionManager.find_longest_cache_hit`
(vllm/v1/core/single_type_kv_cache_manager.py) and its request block hasher (`get_request_block_hasher`,
vLLM's counterpart of mini's `hash_request_tokens`) pass these checks, adapted only in their call shape
(tests/test_course_vllm_answers_p10.py).
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini import roles
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_utils import sha256


def _salted_sha256(input_object: Any) -> bytes:
    """Another hash function: `hash_block_tokens` must call the one it is given, not a fixed one."""
    return sha256(("another hash function", input_object))


def _hash_functions() -> dict[str, Callable[[Any], bytes]]:
    functions = {"sha256": sha256, "another hash function": _salted_sha256}
    try:  # vLLM's sha256_cbor, when cbor2 is installed
        functions["sha256_cbor"] = kv_cache_utils.get_hash_function("sha256_cbor")
    except ValueError:
        pass
    return functions


def _reference(name: str) -> Callable:
    return roles.reference(name)


# ---------------------------------------------------------------- hash_block_tokens
def _hash_cases(rng: random.Random, num_cases: int) -> list[dict[str, Any]]:
    parent = sha256("some parent block")
    salt = (("cache_salt", "tenant-a"),)
    cases = [
        {"hash_function": "sha256", "parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": None},
        {"hash_function": "sha256", "parent_block_hash": parent, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": None},
        {"hash_function": "sha256", "parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": salt},
        {"hash_function": "another hash function", "parent_block_hash": None, "curr_block_token_ids": (5, 6),
         "extra_keys": None},
    ]
    names = list(_hash_functions())
    for _ in range(num_cases):
        cases.append({
            "hash_function": rng.choice(names),
            "parent_block_hash": rng.choice([None, rng.randbytes(32)]),
            "curr_block_token_ids": [rng.randrange(100) for _ in range(rng.randint(1, 8))],
            "extra_keys": rng.choice([None, salt, (("cache_salt", "s"), ("lora", 1))]),
        })
    return cases


def check_hash_block_tokens(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = _reference("hash_block_tokens")
    functions = _hash_functions()
    num_cases = 0
    for seed in seeds:
        for case in _hash_cases(random.Random(seed), 6):
            args = dict(case, hash_function=functions[case["hash_function"]])
            expected = reference(**args)
            with calling("hash_block_tokens", case, expected=expected):
                got = candidate(args["hash_function"], args["parent_block_hash"], args["curr_block_token_ids"],
                                args["extra_keys"])
            expect_equal("hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys)",
                         case, expected, got,
                         "return hash_function((parent or NONE_HASH, tuple(token ids), extra_keys)): the given "
                         "hash function, NONE_HASH as the parent of a first block, the ids as a tuple")
            num_cases += 1
    passed("check_hash_block_tokens", num_cases)


# ---------------------------------------------------------------- hash_request_tokens
def check_hash_request_tokens(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("hash_request_tokens")
    fixed = [(4, list(range(10)), None, 0), (4, list(range(8)), "tenant-a", 0), (16, list(range(55)), None, 1),
             (2, [7], None, 0), (2, list(range(9)), "tenant-b", 2)]
    cases = list(fixed)
    for seed in seeds:
        rng = random.Random(seed)
        tokens = [rng.randrange(50) for _ in range(rng.randint(1, 30))]
        block_size = rng.choice([1, 2, 4, 8])
        cases.append((block_size, tokens, rng.choice([None, "salt"]), rng.randint(0, len(tokens) // block_size)))
    for block_size, tokens, salt, num_known in cases:
        full = reference(block_size, tokens, salt, sha256)
        inputs = {"block_size": block_size, "token_ids": tokens, "cache_salt": salt, "hash_function": "sha256",
                  "known_hashes": f"the first {num_known} of the answer"}
        known = list(full[:num_known])
        with calling("hash_request_tokens", inputs):
            got = candidate(block_size, tokens, salt, sha256, known)
        expect_equal("hash_request_tokens(...)", inputs, full, got,
                     "one hash per FULL block, chained; the salt goes into the first block's extra keys only "
                     "(block_extra_keys); extend known_hashes instead of starting over")
        expect_equal("known_hashes after the call", inputs, full, known, "extend known_hashes in place")
    passed("check_hash_request_tokens", len(cases))


# ---------------------------------------------------------------- find_longest_cache_hit
def _cached_pool(rng: random.Random, num_blocks: int, hashes: list[bytes]) -> BlockPool:
    pool = BlockPool(num_blocks + 1, enable_caching=True)
    blocks = pool.get_new_blocks(num_blocks)
    cached = [index for index in range(min(num_blocks, len(hashes))) if rng.random() < 0.7]
    for index in cached:
        pool.cache_full_blocks(blocks, hashes, index, index + 1)
    pool.free_blocks([block for block in blocks if rng.random() < 0.5])   # freed blocks stay cached
    return pool


def check_find_longest_cache_hit(candidate: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("find_longest_cache_hit")
    num_cases = 0
    for seed in seeds:
        rng = random.Random(seed)
        hashes = [rng.randbytes(32) for _ in range(rng.randint(1, 8))]
        pool = _cached_pool(rng, 8, hashes)
        if seed == 0:  # the classic: three cached blocks, ask with 55 tokens at block size 16
            pool = BlockPool(9, enable_caching=True)
            blocks = pool.get_new_blocks(4)
            extra = [sha256(i) for i in range(3)]
            pool.cache_full_blocks(blocks, hashes + extra, 0, 3)
            hashes = (hashes + extra)[:3]
        block_size = rng.choice([1, 4, 16])
        for max_length in (len(hashes) * block_size, len(hashes) * block_size - 1, block_size, 0):
            cached = sorted(b.block_id for b in pool.cached_blocks())
            inputs = {"block_hashes (first bytes)": [f"{h[:2].hex()}.." for h in hashes],
                      "which of them are cached (indexes)": [i for i, h in enumerate(hashes)
                                                             if pool.get_cached_block(h) is not None],
                      "max_cache_hit_length": max_length, "block_size": block_size, "cached block ids": cached}
            expected = [b.block_id for b in reference(hashes, max_length, pool, block_size)]
            before = _state(pool)
            with calling("find_longest_cache_hit", inputs, expected=expected):
                got = [b.block_id for b in candidate(hashes, max_length, pool, block_size)]
            expect_equal("hit block ids", inputs, expected, got,
                         "walk the hashes from the first, stop at the first miss, never more than "
                         "max_cache_hit_length // block_size blocks")
            expect_equal("the pool after find_longest_cache_hit", inputs, before, _state(pool),
                         "a lookup changes nothing: no ref counts, no free queue (allocate_slots touches the hits)")
            num_cases += 1
    passed("check_find_longest_cache_hit", num_cases)


# ---------------------------------------------------------------- touch
def _state(pool: BlockPool) -> dict[str, Any]:
    return {"ref_cnts": [b.ref_cnt for b in pool.blocks], "free_queue": pool.free_block_ids()}


_TOUCH_HINT = ("skip the null block (block 0: never in the free queue, its ref_cnt is not kept); a free block "
               "(ref_cnt 0) leaves the free queue; every other touched block gets one more reference")


def check_touch(candidate: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in seeds:
        rng = random.Random(seed)
        num_blocks = rng.randint(3, 10)
        reference, pool = BlockPool(num_blocks, enable_caching=True), BlockPool(num_blocks, enable_caching=True)
        pool.touch = types.MethodType(candidate, pool)
        history: list[str] = []
        for _ in range(12):
            free_ids = reference.free_block_ids()
            used_ids = [b.block_id for b in reference.blocks[1:] if b.ref_cnt > 0]
            op = rng.choice(["new", "free", "touch", "touch"])
            if op == "new" and free_ids:
                count = rng.randint(1, len(free_ids))
                reference.get_new_blocks(count)
                pool.get_new_blocks(count)
                history.append(f"get_new_blocks({count})")
                continue
            if op == "free" and used_ids:
                ids = rng.sample(used_ids, rng.randint(1, len(used_ids)))
                reference.free_blocks([reference.blocks[i] for i in ids])
                pool.free_blocks([pool.blocks[i] for i in ids])
                history.append(f"free_blocks({ids})")
                continue
            candidates = free_ids + used_ids
            if not candidates:
                continue
            ids = rng.sample(candidates, rng.randint(1, len(candidates)))
            if rng.random() < 0.3:  # a block table may hold the null block (vLLM: skipped blocks)
                ids.insert(rng.randint(0, len(ids)), 0)
            inputs = {"operations so far": list(history), "state before": _state(reference), "touch": ids}
            reference.touch([reference.blocks[i] for i in ids])
            with calling("touch", inputs, hint=_TOUCH_HINT):
                pool.touch([pool.blocks[i] for i in ids])
            expect_equal("pool after touch (ref_cnts of blocks 0, 1, ...; the free queue)", inputs, _state(reference),
                         _state(pool), _TOUCH_HINT)
            history.append(f"touch({ids})")
            num_cases += 1
    pool = BlockPool(4, enable_caching=True)
    pool.touch = types.MethodType(candidate, pool)
    inputs = {"operations so far": [], "touch": [0], "state before": _state(pool)}
    with calling("touch", inputs, hint=_TOUCH_HINT):
        pool.touch([pool.null_block])
    expect_equal("pool after touching only the null block", inputs, {"ref_cnts": [0, 0, 0, 0], "free_queue": [1, 2, 3]},
                 _state(pool), _TOUCH_HINT)
    passed("check_touch", num_cases + 1)


PHASE = Phase("10_prefix_caching", (
    Exercise("hash_block_tokens", check_hash_block_tokens, points=2, grade_id="test-hash-block-tokens", part="hash_block_tokens"),
    Exercise("hash_request_tokens", check_hash_request_tokens, points=2, grade_id="test-hash-request-tokens", part="hash_request_tokens"),
    Exercise("find_longest_cache_hit", check_find_longest_cache_hit, points=3, grade_id="test-longest-hit", part="find_longest_cache_hit"),
    Exercise("touch", check_touch, points=2, grade_id="test-touch", part="touch"),
))
