"""Checks for phase 01 (paged KV memory), against mini.core.

    check_free_block_queue(FreeKVCacheBlockQueue)   vs mini.core.kv_cache_utils.FreeKVCacheBlockQueue
    check_get_new_blocks(get_new_blocks)            vs mini.core.block_pool.BlockPool.get_new_blocks
    check_free_blocks(free_blocks)                  vs mini.core.block_pool.BlockPool.free_blocks
    check_allocate_slots(allocate_slots)            vs KVCacheManager.allocate_slots

Each check replays the same operations on a reference object and on one using the learner's code,
and compares the observable state (returned block ids, ref counts, free-queue order) after each.
"""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from mini.core.request import Request
from mini.sampling_params import SamplingParams


def _ids(blocks: Iterable[KVCacheBlock] | None) -> list[int] | None:
    return None if blocks is None else [block.block_id for block in blocks]


def _pool_state(pool: BlockPool) -> dict[str, Any]:
    return {
        "free_queue": _ids(pool.free_block_queue.get_all_free_blocks()),
        "num_free_blocks": pool.get_num_free_blocks(),
        "ref_cnts": [block.ref_cnt for block in pool.blocks],
    }


# ---------------------------------------------------------------- the free-block queue
def _queue_ops(rng: random.Random, num_blocks: int, num_ops: int) -> list[tuple]:
    free = list(range(num_blocks))
    taken: list[int] = []
    ops: list[tuple] = []
    for _ in range(num_ops):
        choices = ["append"] if taken else []
        if free:
            choices += ["popleft", "remove", "popleft_n"]
        if len(taken) >= 2:
            choices.append("append_n")
        op = rng.choice(choices)
        if op == "popleft":
            taken.append(free.pop(0))
            ops.append(("popleft",))
        elif op == "popleft_n":
            count = rng.randint(0, len(free))
            taken += free[:count]
            del free[:count]
            ops.append(("popleft_n", count))
        elif op == "remove":
            block_id = rng.choice(free)
            free.remove(block_id)
            taken.append(block_id)
            ops.append(("remove", block_id))
        elif op == "append":
            block_id = taken.pop(rng.randrange(len(taken)))
            free.append(block_id)
            ops.append(("append", block_id))
        else:
            count = rng.randint(2, len(taken))
            moved = [taken.pop(rng.randrange(len(taken))) for _ in range(count)]
            free += moved
            ops.append(("append_n", moved))
    return ops


def _apply_queue_op(queue: Any, blocks: list[KVCacheBlock], op: tuple) -> Any:
    name = op[0]
    if name == "popleft":
        return queue.popleft().block_id
    if name == "popleft_n":
        return _ids(queue.popleft_n(op[1]))
    if name == "remove":
        return queue.remove(blocks[op[1]])
    if name == "append":
        return queue.append(blocks[op[1]])
    return queue.append_n([blocks[i] for i in op[1]])


def _queue_state(queue: Any) -> tuple[int, list[int]]:
    return queue.num_free_blocks, _ids(queue.get_all_free_blocks())


def _replay_queue(queue_class: type, num_blocks: int, ops: list[tuple]) -> None:
    ref_blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    lab_blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    reference = FreeKVCacheBlockQueue(ref_blocks)
    inputs: dict[str, Any] = {"blocks": f"KVCacheBlock 0..{num_blocks - 1}", "ops so far": []}
    with calling("FreeKVCacheBlockQueue", inputs):
        queue = queue_class(lab_blocks)
    expect_equal(
        "FreeKVCacheBlockQueue(blocks)",
        inputs,
        _queue_state(reference),
        _queue_state(queue),
        "(num_free_blocks, ids from head to tail) right after __init__: every block, in order",
    )
    for op in ops:
        inputs["ops so far"].append(op)
        expected = _apply_queue_op(reference, ref_blocks, op)
        with calling("FreeKVCacheBlockQueue", inputs, expected=expected):
            got = _apply_queue_op(queue, lab_blocks, op)
        expect_equal(
            f"{op[0]} return value",
            inputs,
            expected,
            got,
            "popleft returns the head block; popleft_n(n) the first n in order; the others None",
        )
        expect_equal(
            f"state after {op[0]}",
            inputs,
            _queue_state(reference),
            _queue_state(queue),
            "(num_free_blocks, get_all_free_blocks ids head->tail); append goes to the TAIL",
        )


def check_free_block_queue(queue_class: type, seeds: Iterable[int] = range(20)) -> None:
    fixed = [
        ("popleft",),
        ("remove", 3),
        ("append", 0),
        ("popleft_n", 2),
        ("append_n", [3, 1]),
        ("remove", 5),
        ("popleft",),
    ]
    _replay_queue(queue_class, 6, fixed)
    num_cases = 1
    for seed in seeds:
        rng = random.Random(seed)
        num_blocks = rng.randint(1, 3 + seed % 16)  # small cases first; hidden seeds stay small too
        _replay_queue(queue_class, num_blocks, _queue_ops(rng, num_blocks, num_ops=3 + seed % 24))
        num_cases += 1
    empty = queue_class([])
    with calling("FreeKVCacheBlockQueue"):
        try:
            empty.popleft()
        except ValueError:
            pass
        else:
            raise AssertionError(
                "FreeKVCacheBlockQueue([]).popleft() returned instead of raising ValueError\n"
                "  hint: popping from an empty queue must raise ValueError (the scheduler relies on it)"
            )
    passed("check_free_block_queue", num_cases + 1)


# ---------------------------------------------------------------- the block pool
def _pool_with(method_name: str, function: Callable, num_gpu_blocks: int) -> BlockPool:
    pool = BlockPool(num_gpu_blocks, enable_caching=False)
    setattr(pool, method_name, types.MethodType(function, pool))
    return pool


def _expect_value_error(action: Callable[[], Any], what: str, inputs: dict, hint: str, name: str) -> None:
    with calling(name, inputs):
        try:
            action()
        except ValueError:
            return
    raise AssertionError(
        f"{what}: expected ValueError, nothing was raised\n  inputs: {inputs}\n  hint: {hint}"
    )


def check_get_new_blocks(get_new_blocks: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in [-1, *seeds]:
        rng = random.Random(seed)
        num_gpu_blocks = 6 if seed < 0 else rng.randint(2, 12)
        reference = BlockPool(num_gpu_blocks)
        pool = _pool_with("get_new_blocks", get_new_blocks, num_gpu_blocks)
        inputs: dict[str, Any] = {"num_gpu_blocks": num_gpu_blocks, "calls so far": []}
        requests = [(2,), (3,), ("free", 1), (1,)] if seed < 0 else [None] * rng.randint(1, 6)
        held: list[list[int]] = []
        for step in requests:
            if step is None and held and rng.random() < 0.3:
                step = ("free", rng.randrange(len(held)))
            if step is not None and step[0] == "free":
                if step[1] >= len(held):
                    continue
                block_ids = held.pop(step[1])
                inputs["calls so far"].append(f"free_blocks({block_ids}) (reference)")
                reference.free_blocks([reference.blocks[i] for i in block_ids])
                pool.free_blocks([pool.blocks[i] for i in block_ids])
                continue
            count = step[0] if step is not None else rng.randint(0, reference.get_num_free_blocks())
            inputs["calls so far"].append(f"get_new_blocks({count})")
            expected = _ids(reference.get_new_blocks(count))
            with calling("get_new_blocks", inputs, expected=expected):
                got = _ids(pool.get_new_blocks(count))
            held.append(expected)
            expect_equal(
                "get_new_blocks return value",
                inputs,
                expected,
                got,
                "pop blocks from the HEAD of self.free_block_queue; block 0 (null) is never handed out",
            )
            expect_equal(
                "pool state after get_new_blocks",
                inputs,
                _pool_state(reference),
                _pool_state(pool),
                "every returned block gets ref_cnt = 1 and leaves the free queue",
            )
        too_many = reference.get_num_free_blocks() + 1
        before = _pool_state(pool)
        inputs["calls so far"].append(f"get_new_blocks({too_many})  # one more than free")
        _expect_value_error(
            functools.partial(pool.get_new_blocks, too_many),
            "asking for more blocks than are free",
            inputs,
            "check the free count first and raise ValueError",
            "get_new_blocks",
        )
        expect_equal(
            "pool state after a refused get_new_blocks",
            inputs,
            before,
            _pool_state(pool),
            "a refused request must not change anything",
        )
        num_cases += 1
    passed("check_get_new_blocks", num_cases)


def check_free_blocks(free_blocks: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in [-1, *seeds]:
        rng = random.Random(seed)
        num_gpu_blocks = 8 if seed < 0 else rng.randint(3, 14)
        reference = BlockPool(num_gpu_blocks)
        pool = _pool_with("free_blocks", free_blocks, num_gpu_blocks)
        count = 5 if seed < 0 else rng.randint(1, num_gpu_blocks - 1)
        block_ids = _ids(reference.get_new_blocks(count))
        pool.get_new_blocks(count)
        shared = block_ids[:2] if seed < 0 else rng.sample(block_ids, rng.randint(0, len(block_ids)))
        for target in (reference, pool):  # a second owner: ref_cnt 2 (e.g. a shared prefix)
            target.touch([target.blocks[i] for i in shared])
        order = (
            [block_ids[4], block_ids[2], block_ids[0]] if seed < 0 else rng.sample(block_ids, len(block_ids))
        )
        inputs = {
            "num_gpu_blocks": num_gpu_blocks,
            "allocated (ref_cnt 1)": block_ids,
            "shared (ref_cnt 2)": shared,
            "free_blocks(ordered_blocks) with ids": order,
        }
        reference.free_blocks([reference.blocks[i] for i in order])
        with calling("free_blocks", inputs):
            pool.free_blocks([pool.blocks[i] for i in order])
        expect_equal(
            "pool state after free_blocks",
            inputs,
            _pool_state(reference),
            _pool_state(pool),
            "decrement ref_cnt; only a block reaching 0 joins the TAIL of the free queue, in the given order",
        )
        num_cases += 1
    pool = _pool_with("free_blocks", free_blocks, 4)
    _expect_value_error(
        lambda: pool.free_blocks([pool.null_block]),
        "freeing the null block",
        {"ordered_blocks": "[block 0 (the null block)]"},
        "block 0 is never handed out, so freeing it is a bug: raise ValueError",
        "free_blocks",
    )
    block = pool.get_new_blocks(1)[0]
    pool.free_blocks([block])
    _expect_value_error(
        lambda: pool.free_blocks([block]),
        "freeing a block twice",
        {"ordered_blocks": f"[block {block.block_id} (ref_cnt already 0)]"},
        "a block with ref_cnt 0 is already free: raise ValueError (double free)",
        "free_blocks",
    )
    passed("check_free_blocks", num_cases + 2)


# ---------------------------------------------------------------- the KV cache manager
def _request(request_id: str, num_prompt_tokens: int) -> Request:
    return Request(request_id, list(range(1, num_prompt_tokens + 1)), SamplingParams(max_tokens=4))


def _manager_state(manager: KVCacheManager, request_ids: list[str]) -> dict[str, Any]:
    return {
        "block_ids": {rid: manager.get_block_ids(rid) for rid in request_ids},
        **_pool_state(manager.block_pool),
    }


def check_allocate_slots(allocate_slots: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in [-1, *seeds]:
        rng = random.Random(seed)
        block_size = 4 if seed < 0 else rng.choice([1, 2, 4, 16])
        num_gpu_blocks = 6 if seed < 0 else rng.randint(2, 12)
        reference = KVCacheManager(num_gpu_blocks, block_size)
        manager = KVCacheManager(num_gpu_blocks, block_size)
        manager.allocate_slots = types.MethodType(allocate_slots, manager)
        num_reqs = 3 if seed < 0 else rng.randint(1, 4)
        prompt_lens = [5, 7, 3] if seed < 0 else [rng.randint(1, 3 * block_size) for _ in range(num_reqs)]
        ref_reqs = [_request(f"r{i}", n) for i, n in enumerate(prompt_lens)]
        lab_reqs = [_request(f"r{i}", n) for i, n in enumerate(prompt_lens)]
        ids = [r.request_id for r in ref_reqs]
        inputs: dict[str, Any] = {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "prompt_lens": prompt_lens,
            "calls so far": [],
        }
        for _ in range(6):
            index = rng.randrange(num_reqs)
            ref_req, lab_req = ref_reqs[index], lab_reqs[index]
            remaining = ref_req.num_tokens - ref_req.num_computed_tokens  # 1 for a decode step
            num_new = remaining
            if remaining > 1 and rng.random() < 0.4:
                num_new = rng.randint(1, remaining)  # a chunk of a chunked prefill
            inputs["calls so far"].append(
                f"allocate_slots({ref_req.request_id}, num_new_tokens={num_new}) "
                f"with num_computed_tokens={ref_req.num_computed_tokens}"
            )
            expected = _ids(reference.allocate_slots(ref_req, num_new))
            with calling("allocate_slots", inputs, expected=expected):
                got = _ids(manager.allocate_slots(lab_req, num_new))
            expect_equal(
                "allocate_slots return value",
                inputs,
                expected,
                got,
                "return only the NEW blocks (maybe []), or None when too few blocks are free",
            )
            expect_equal(
                "manager state after allocate_slots",
                inputs,
                _manager_state(reference, ids),
                _manager_state(manager, ids),
                "blocks must cover num_computed_tokens + num_new_tokens; None changes nothing",
            )
            if expected is not None:
                for req in (ref_req, lab_req):
                    req.num_computed_tokens += num_new
                    if req.num_computed_tokens == req.num_tokens:  # all computed: a token is sampled
                        req.append_output_token_ids(7)
        num_cases += 1
    passed("check_allocate_slots", num_cases)


PHASE = Phase("01_paged_kv", (
    Exercise("FreeKVCacheBlockQueue", check_free_block_queue, points=4, grade_id="test-free-block-queue", seam="FreeKVCacheBlockQueue"),
    Exercise("get_new_blocks", check_get_new_blocks, points=2, grade_id="test-get-new-blocks", seam="get_new_blocks"),
    Exercise("free_blocks", check_free_blocks, points=2, grade_id="test-free-blocks", seam="free_blocks"),
    Exercise("allocate_slots", check_allocate_slots, points=3, grade_id="test-allocate-slots", seam="allocate_slots"),
))
