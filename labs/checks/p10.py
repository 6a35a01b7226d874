"""Checks for phase 10 (prefix caching), against mini.core.

    check_hash_block_tokens(hash_block_tokens)           vs mini.core.kv_cache_utils.hash_block_tokens
    check_hash_request_tokens(hash_request_tokens)       vs mini.core.kv_cache_utils.hash_request_tokens
    check_find_longest_cache_hit(find_longest_cache_hit) vs mini.core.kv_cache_manager.find_longest_cache_hit
    check_touch(touch)                                   vs mini.core.block_pool.BlockPool.touch
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini import seams
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_utils import sha256

HASH_FUNCTIONS = {"hash": hash, "sha256": sha256}


def _reference(name: str) -> Callable:
    return seams.reference(name)


# ---------------------------------------------------------------- hash_block_tokens
def _hash_cases(rng: random.Random, num_cases: int) -> list[dict[str, Any]]:
    cases = [
        {"parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": None, "hash_function": "hash"},
        {"parent_block_hash": 12345, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": None, "hash_function": "hash"},
        {"parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4], "extra_keys": ("tenant-a",),
         "hash_function": "hash"},
        {"parent_block_hash": None, "curr_block_token_ids": (5, 6), "extra_keys": None, "hash_function": "sha256"},
    ]
    for _ in range(num_cases):
        cases.append({
            "parent_block_hash": rng.choice([None, rng.getrandbits(64)]),
            "curr_block_token_ids": [rng.randrange(100) for _ in range(rng.randint(1, 8))],
            "extra_keys": rng.choice([None, ("salt",), ("s", 1)]),
            "hash_function": rng.choice(["hash", "sha256"]),
        })
    return cases


def check_hash_block_tokens(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = _reference("hash_block_tokens")
    num_cases = 0
    for seed in seeds:
        for case in _hash_cases(random.Random(seed), 6):
            args = dict(case, hash_function=HASH_FUNCTIONS[case["hash_function"]])
            expected = reference(**args)
            with calling("hash_block_tokens", case):
                got = candidate(**args)
            expect_equal("hash_block_tokens(...)", case, expected, got,
                         "hash the tuple (parent or NONE_HASH, tuple(token ids), extra_keys) with hash_function")
            num_cases += 1
    passed("check_hash_block_tokens", num_cases)


# ---------------------------------------------------------------- hash_request_tokens
def check_hash_request_tokens(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("hash_request_tokens")
    fixed = [(4, list(range(10)), None, 0), (4, list(range(8)), "tenant-a", 0), (16, list(range(55)), None, 1),
             (2, [7], None, 0)]
    cases = list(fixed)
    for seed in seeds:
        rng = random.Random(seed)
        tokens = [rng.randrange(50) for _ in range(rng.randint(1, 30))]
        block_size = rng.choice([1, 2, 4, 8])
        cases.append((block_size, tokens, rng.choice([None, "salt"]), rng.randint(0, len(tokens) // block_size)))
    for block_size, tokens, salt, num_known in cases:
        full = reference(block_size, tokens, salt, hash)
        inputs = {"block_size": block_size, "token_ids": tokens, "cache_salt": salt,
                  "known_hashes": f"the first {num_known} of the answer"}
        known = list(full[:num_known])
        with calling("hash_request_tokens", inputs):
            got = candidate(block_size, tokens, salt, hash, known)
        expect_equal("hash_request_tokens(...)", inputs, full, got,
                     "one hash per FULL block, chained; the salt goes into the first block's extra keys only; "
                     "extend known_hashes instead of starting over")
        expect_equal("known_hashes after the call", inputs, full, known, "extend known_hashes in place")
    passed("check_hash_request_tokens", len(cases))


# ---------------------------------------------------------------- find_longest_cache_hit
def _cached_pool(rng: random.Random, num_blocks: int, hashes: list[int]) -> BlockPool:
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
        hashes = [rng.getrandbits(32) for _ in range(rng.randint(1, 8))]
        pool = _cached_pool(rng, 8, hashes)
        if seed == 0:  # the classic: three cached blocks, ask with 55 tokens at block size 16
            pool = BlockPool(9, enable_caching=True)
            blocks = pool.get_new_blocks(4)
            pool.cache_full_blocks(blocks, hashes + [1, 2, 3], 0, 3)
            hashes = (hashes + [1, 2, 3])[:3]
        block_size = rng.choice([1, 4, 16])
        for max_length in (len(hashes) * block_size, len(hashes) * block_size - 1, block_size, 0):
            cached = sorted(b.block_id for b in pool.cached_blocks())
            inputs = {"block_hashes": hashes, "max_cache_hit_length": max_length, "block_size": block_size,
                      "cached block ids": cached}
            expected = [b.block_id for b in reference(hashes, max_length, pool, block_size)]
            with calling("find_longest_cache_hit", inputs):
                got = [b.block_id for b in candidate(hashes, max_length, pool, block_size)]
            expect_equal("hit block ids", inputs, expected, got,
                         "walk the hashes from the first, stop at the first miss, never more than "
                         "max_cache_hit_length // block_size blocks")
            num_cases += 1
    passed("check_find_longest_cache_hit", num_cases)


# ---------------------------------------------------------------- touch
def _state(pool: BlockPool) -> dict[str, Any]:
    return {"ref_cnts": [b.ref_cnt for b in pool.blocks], "free_queue": pool.free_block_ids()}


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
            inputs = {"operations so far": list(history), "state before": _state(reference), "touch": ids}
            reference.touch([reference.blocks[i] for i in ids])
            with calling("touch", inputs):
                pool.touch([pool.blocks[i] for i in ids])
            expect_equal("pool after touch", inputs, _state(reference), _state(pool),
                         "a free block (ref_cnt 0) leaves the free queue; every touched block gets one more reference")
            history.append(f"touch({ids})")
            num_cases += 1
    passed("check_touch", num_cases)


PHASE = Phase("10_prefix_caching", (
    Exercise("hash_block_tokens", check_hash_block_tokens, points=2, grade_id="test-hash-block-tokens", seam="hash_block_tokens"),
    Exercise("hash_request_tokens", check_hash_request_tokens, points=2, grade_id="test-hash-request-tokens", seam="hash_request_tokens"),
    Exercise("find_longest_cache_hit", check_find_longest_cache_hit, points=3, grade_id="test-longest-hit", seam="find_longest_cache_hit"),
    Exercise("touch", check_touch, points=2, grade_id="test-touch", seam="touch"),
))
