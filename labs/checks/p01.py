"""Checks for phase 01 (paged KV memory), against mini.core.

    check_free_block_queue(FreeKVCacheBlockQueue)   vs mini.core.kv_cache_utils.FreeKVCacheBlockQueue
    check_get_new_blocks(get_new_blocks)            vs mini.core.block_pool.BlockPool.get_new_blocks
    check_free_blocks(free_blocks)                  vs mini.core.block_pool.BlockPool.free_blocks
    check_allocate_slots(allocate_slots)            vs KVCacheManager.allocate_slots

Each check replays the same operations on a reference object and on one using the learner's code,
and compares the observable state (returned block ids, ref counts, free-queue order) after each. The
queue check also walks the links (`prev_free_block` / `next_free_block`, the sentinels
`fake_free_list_head` / `fake_free_list_tail`, vLLM's names) and counts the work each O(1) operation does;
its fixed case ends with `prepend_n([])` and `append_n([])`, which the pool calls whenever nothing goes to that
end. `free_blocks` is given a one-pass iterator, as the manager's `reversed(blocks)`. `allocate_slots` replays
a fixed sequence (prefix hits, a refusal, a hit that sits in the free queue, a prompt computed in chunks), then
random ones; a wrong return value is explained with that call's numbers. Whatever the learner's code returns or
leaves in its state, the checks report it (a wrong answer never crashes them).

vLLM v0.33.0's own `FreeKVCacheBlockQueue`, `BlockPool.get_new_blocks` and `BlockPool.free_blocks`
(vllm/v1/core/kv_cache_utils.py, vllm/v1/core/block_pool.py) pass these checks
(tests/course/vllm_answers/test_p01.py). `allocate_slots` has no vLLM counterpart that runs on its own:
vLLM's `KVCacheManager.allocate_slots` goes through the KV-cache coordinator and its per-type managers;
mini's is the full-attention, single-group case of it.
"""

from __future__ import annotations

import contextlib
import functools
import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, expect_same, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.core.block_pool import BlockPool, usable_blocks
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock, sha256
from mini.core.request import Request
from mini.sampling_params import SamplingParams


def _ids(blocks: Iterable[KVCacheBlock] | None) -> Any:
    """The block ids of `blocks` (None stays None). Tolerant of a learner's odd value: an entry that is not a
    block is shown as it is, and a value that is not a list of blocks at all is returned unchanged, so that
    the comparison that follows reports it instead of the check crashing."""
    if blocks is None:
        return None
    try:
        return [_block_id(block) for block in blocks]
    except TypeError:
        return blocks


def _block_id(block: Any) -> Any:
    return getattr(block, "block_id", block)


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
            choices += ["append_n", "prepend_n"]
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
            free[:0] = moved if op == "prepend_n" else []
            free += moved if op == "append_n" else []
            ops.append((op, moved))
    return ops


def _apply_queue_op(queue: Any, blocks: list[KVCacheBlock], op: tuple) -> Any:
    name = op[0]
    if name == "popleft":
        return _block_id(queue.popleft())
    if name == "popleft_n":
        return _ids(queue.popleft_n(op[1]))
    if name == "remove":
        return queue.remove(blocks[op[1]])
    if name == "append":
        return queue.append(blocks[op[1]])
    if name == "prepend_n":
        return queue.prepend_n([blocks[i] for i in op[1]])
    return queue.append_n([blocks[i] for i in op[1]])


def _link_problem(queue: Any, blocks: list[KVCacheBlock]) -> str | None:
    """What is wrong with the links of `queue` (None when they are a proper doubly linked list)."""
    try:
        return _walk_links(queue, blocks)
    except Exception as error:  # noqa: BLE001 - odd links are a wrong answer to report, not a crash
        return (f"walking the links from fake_free_list_head raised {type(error).__name__}: {error} (every link "
                "must be a KVCacheBlock: a neighbour, a sentinel, or None outside the queue)")


def _walk_links(queue: Any, blocks: list[KVCacheBlock]) -> str | None:
    head = getattr(queue, "fake_free_list_head", None)
    tail = getattr(queue, "fake_free_list_tail", None)
    if not isinstance(head, KVCacheBlock) or not isinstance(tail, KVCacheBlock):
        return ("no sentinel blocks: the queue must keep a fake head and a fake tail, KVCacheBlock(block_id=-1), "
                "as self.fake_free_list_head / self.fake_free_list_tail")
    order, node, seen = [], head.next_free_block, 0
    while node is not tail:
        if node is None or seen > len(blocks):
            return "following next_free_block from fake_free_list_head does not reach fake_free_list_tail"
        if node.prev_free_block is not (order[-1] if order else head):
            return f"block {node.block_id}.prev_free_block does not point back to the block before it"
        order.append(node)
        node, seen = node.next_free_block, seen + 1
    if tail.prev_free_block is not (order[-1] if order else head):
        return "fake_free_list_tail.prev_free_block is not the last free block"
    linked = {id(block) for block in order}
    for block in blocks:
        if id(block) not in linked and (block.prev_free_block is not None or block.next_free_block is not None):
            return (f"block {block.block_id} is not free but still has a prev_free_block / next_free_block link "
                    "(reset both to None when a block leaves the queue)")
    if [b.block_id for b in order] != _ids(queue.get_all_free_blocks()):
        return "the blocks linked from fake_free_list_head are not the ones get_all_free_blocks returns"
    return None


def _queue_state(queue: Any) -> dict[str, Any]:
    return {"num_free_blocks": queue.num_free_blocks, "free queue (head -> tail)": _ids(queue.get_all_free_blocks())}


def _lab_queue_state(queue: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The learner's queue state, read as the learner's code: a missing attribute or a raising
    get_all_free_blocks is reported (with the operations so far), never a crash of the check."""
    with calling("FreeKVCacheBlockQueue", inputs,
                 hint="the check reads num_free_blocks (an attribute kept up to date by every operation) and "
                      "get_all_free_blocks() (the free blocks, head to tail) after every operation"):
        return _queue_state(queue)


_LINKS_HINT = ("every operation keeps the list doubly linked: a free block's prev_free_block and next_free_block "
               "are its neighbours (a sentinel at either end), and a block that leaves the queue gets None in both")


def _empty_list_note(op: tuple) -> str:
    if op[0] in ("prepend_n", "append_n") and not op[1]:
        return (f". {op[0]}([]) must change nothing: the pool calls it with an empty list whenever no freed block "
                "goes to that end of the queue")
    return ""


def _op_hint(op: tuple) -> str:
    return _empty_list_note(op)[2:] or _LINKS_HINT


def _replay_queue(queue_class: type, num_blocks: int, ops: list[tuple]) -> None:
    ref_blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    lab_blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    reference = FreeKVCacheBlockQueue(ref_blocks)
    inputs: dict[str, Any] = {"blocks": f"KVCacheBlock 0..{num_blocks - 1}", "ops so far": []}
    with calling("FreeKVCacheBlockQueue", inputs):
        queue = queue_class(lab_blocks)
    expect_same(
        "FreeKVCacheBlockQueue(blocks)",
        inputs,
        _queue_state(reference),
        _lab_queue_state(queue, inputs),
        "right after __init__ the queue holds every block, in the order given",
    )
    for op in ops:
        inputs["ops so far"].append(op)
        expected = _apply_queue_op(reference, ref_blocks, op)
        with calling("FreeKVCacheBlockQueue", inputs, expected=expected, hint=_op_hint(op)):
            got = _apply_queue_op(queue, lab_blocks, op)
        expect_equal(
            f"{op[0]} return value",
            inputs,
            expected,
            got,
            "popleft returns the head block; popleft_n(n) the first n in order; the others None",
        )
        expect_same(
            f"state after {op[0]}",
            inputs,
            _queue_state(reference),
            _lab_queue_state(queue, inputs),
            "num_free_blocks and get_all_free_blocks (ids head->tail); append goes to the TAIL, "
            "prepend_n puts its blocks at the HEAD in the given order" + _empty_list_note(op),
        )
        expect_equal(f"the links after {op[0]}", inputs, None, _link_problem(queue, lab_blocks),
                     "a doubly linked list threaded through the blocks: each free block's prev_free_block / "
                     "next_free_block are its neighbours (the sentinels at the ends), other blocks have None")


class _CountingBlock(KVCacheBlock):
    """A KVCacheBlock that counts every read and write of its links, and every `==` on it."""

    link_uses = 0
    comparisons = 0

    def __eq__(self, other: object) -> bool:
        _CountingBlock.comparisons += 1
        return self is other

    __hash__ = object.__hash__

    @property
    def prev_free_block(self) -> KVCacheBlock | None:
        _CountingBlock.link_uses += 1
        return self.__dict__.get("_prev")

    @prev_free_block.setter
    def prev_free_block(self, value: KVCacheBlock | None) -> None:
        _CountingBlock.link_uses += 1
        self.__dict__["_prev"] = value

    @property
    def next_free_block(self) -> KVCacheBlock | None:
        _CountingBlock.link_uses += 1
        return self.__dict__.get("_next")

    @next_free_block.setter
    def next_free_block(self, value: KVCacheBlock | None) -> None:
        _CountingBlock.link_uses += 1
        self.__dict__["_next"] = value


_MAX_LINK_USES = 16  # vLLM's remove / popleft / append touch about 6 links


def _check_constant_time(queue_class: type) -> None:
    """remove, popleft and append must not walk or search the queue: count links used and comparisons."""
    num_blocks = 200
    blocks = [_CountingBlock(block_id=i) for i in range(num_blocks)]
    inputs = {"blocks": f"KVCacheBlock 0..{num_blocks - 1}", "ops": []}
    with calling("FreeKVCacheBlockQueue", inputs):
        queue = queue_class(blocks)
    for name, action in (("remove(block 150)", lambda: queue.remove(blocks[150])),
                         ("remove(block 199)", lambda: queue.remove(blocks[199])),
                         ("popleft()", queue.popleft),
                         ("append(block 150)", lambda: queue.append(blocks[150]))):
        inputs["ops"].append(name)
        _CountingBlock.link_uses = _CountingBlock.comparisons = 0
        with calling("FreeKVCacheBlockQueue", inputs):
            action()
        work = {"links read or written": _CountingBlock.link_uses, "== comparisons": _CountingBlock.comparisons}
        expect_equal(f"the work done by {name} in a queue of {num_blocks} blocks", inputs,
                     f"at most {_MAX_LINK_USES} links and no comparison (O(1))",
                     work if work["links read or written"] > _MAX_LINK_USES or work["== comparisons"] else
                     f"at most {_MAX_LINK_USES} links and no comparison (O(1))",
                     "O(1): unlink through block.prev_free_block / block.next_free_block directly; never "
                     "search a list (list.remove / index / `in` compare every element) or walk the queue")


@graded
def check_free_block_queue(queue_class: type, seeds: Iterable[int] = range(20)) -> None:
    fixed = [
        ("popleft",),
        ("remove", 3),
        ("append", 0),
        ("popleft_n", 2),
        ("append_n", [3, 1]),
        ("remove", 5),
        ("prepend_n", [5, 2]),
        ("popleft",),
        ("prepend_n", []),   # the pool frees with prepend_n / append_n of lists that are often empty
        ("append_n", []),
    ]
    _replay_queue(queue_class, 6, fixed)
    _check_constant_time(queue_class)
    num_cases = 2
    for seed in seeds:
        rng = random.Random(seed)
        num_blocks = rng.randint(1, 3 + seed % 16)  # small cases first; hidden seeds stay small too
        _replay_queue(queue_class, num_blocks, _queue_ops(rng, num_blocks, num_ops=3 + seed % 24))
        num_cases += 1
    empty_hint = ("popping from an empty queue must raise ValueError (the pool relies on it): the head "
                  "sentinel's successor is then the tail sentinel, which is not a free block")
    with calling("FreeKVCacheBlockQueue", {"calls": ["FreeKVCacheBlockQueue([])", "popleft()"]}, hint=empty_hint):
        empty = queue_class([])
        try:
            popped = empty.popleft()
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"FreeKVCacheBlockQueue([]).popleft() returned {_block_id(popped)!r} instead of raising ValueError\n"
                f"  hint: {empty_hint}"
            )
    passed("check_free_block_queue", num_cases + 1)


# ---------------------------------------------------------------- the block pool
def _pool_with(method_name: str, function: Callable, num_gpu_blocks: int) -> BlockPool:
    pool = BlockPool(num_gpu_blocks, enable_caching=False)
    setattr(pool, method_name, types.MethodType(function, pool))
    return pool


def _expect_value_error(action: Callable[[], Any], what: str, inputs: dict, hint: str, name: str) -> None:
    with calling(name, inputs, hint=f"{what}: expected ValueError. {hint}"):
        try:
            action()
        except ValueError:
            return
        except AssertionError as error:  # the learner's own `assert`: the wrong exception, not a failed check
            raise AssertionError(
                f"{what}: expected ValueError, got AssertionError (an assert?): {error}\n  inputs: {inputs}\n"
                f"  hint: {hint}. An assert is the wrong tool: python -O strips it, and the caller catches "
                "ValueError") from None
    raise AssertionError(
        f"{what}: expected ValueError, nothing was raised\n  inputs: {inputs}\n  hint: {hint}"
    )


def _order_hint(expected: Any, got: Any) -> str:
    hint = "pop blocks from the HEAD of self.free_block_queue; block 0 (null) is never handed out"
    if isinstance(got, list) and expected is not None and sorted(map(str, got)) == sorted(map(str, expected)):
        return f"the right blocks in the wrong order: return them in queue order (head first). {hint}"
    if isinstance(got, list) and expected is not None and len(got) != len(expected):
        return f"{len(expected)} block(s) asked for, {len(got)} returned: all of them or none (ValueError). {hint}"
    return hint


@graded
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
            free_before = reference.get_num_free_blocks()
            inputs["calls so far"].append(f"get_new_blocks({count})")
            expected = _ids(reference.get_new_blocks(count))
            with calling("get_new_blocks", inputs, expected=expected,
                         hint=f"raise ValueError only when MORE blocks are asked for than are free: asking for "
                              f"exactly the {free_before} free block(s), or for 0, must succeed"):
                got = _ids(pool.get_new_blocks(count))
            held.append(expected)
            expect_equal(
                "get_new_blocks return value",
                inputs,
                expected,
                got,
                _order_hint(expected, got),
            )
            expect_same(
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
            "check the free count first and raise ValueError, before popping anything",
            "get_new_blocks",
        )
        expect_same(
            "pool state after a refused get_new_blocks",
            inputs,
            before,
            _pool_state(pool),
            "a refused request must not change anything",
        )
        num_cases += 1
    passed("check_get_new_blocks", num_cases)


def _free_case(seed: int) -> dict[str, Any]:
    """A pool state and a free_blocks call: some blocks shared (ref_cnt 2), some cached (a hash)."""
    rng = random.Random(seed)
    if seed < 0:  # the fixed case: 5 blocks, 1 and 2 shared, 2 and 3 cached, freed last block first
        return {"num_gpu_blocks": 8, "enable_caching": True, "count": 5, "shared_at": [0, 1],
                "cached_at": [1, 2], "order_at": [4, 3, 2, 1, 0]}
    num_gpu_blocks = rng.randint(3, 14)
    count = rng.randint(1, usable_blocks(num_gpu_blocks))
    return {"num_gpu_blocks": num_gpu_blocks, "enable_caching": rng.random() < 0.6, "count": count,
            "shared_at": rng.sample(range(count), rng.randint(0, count)),
            "cached_at": rng.sample(range(count), rng.randint(0, count)),
            "order_at": rng.sample(range(count), count)}


def _prepare_free_case(pool: BlockPool, case: dict[str, Any]) -> list[int]:
    """Allocate the case's blocks in `pool` (caching off: fresh pools hand out 1, 2, ...), share and hash some."""
    block_ids = _ids(pool.get_new_blocks(case["count"]))
    pool.touch([pool.blocks[block_ids[i]] for i in case["shared_at"]])      # a second owner: ref_cnt 2
    for i in case["cached_at"]:
        pool.blocks[block_ids[i]].block_hash = sha256(("block", block_ids[i]))  # a full, cached block
    return block_ids


@graded
def check_free_blocks(free_blocks: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in [-1, *seeds]:
        case = _free_case(seed)
        reference = BlockPool(case["num_gpu_blocks"], enable_caching=case["enable_caching"])
        pool = BlockPool(case["num_gpu_blocks"], enable_caching=case["enable_caching"])
        block_ids = _prepare_free_case(reference, case)
        _prepare_free_case(pool, case)
        pool.free_blocks = types.MethodType(free_blocks, pool)
        order = [block_ids[i] for i in case["order_at"]]
        inputs = {
            "num_gpu_blocks": case["num_gpu_blocks"],
            "enable_caching": case["enable_caching"],
            "allocated (ref_cnt 1)": block_ids,
            "shared (ref_cnt 2)": [block_ids[i] for i in case["shared_at"]],
            "cached (block_hash set)": [block_ids[i] for i in case["cached_at"]],
            "free queue before (head -> tail)": reference.free_block_ids(),
            "free_blocks(ordered_blocks) with ids": order,
            "ordered_blocks is": "a one-pass iterator over those blocks (as the manager's reversed(blocks))",
        }
        reference.free_blocks([reference.blocks[i] for i in order])
        with calling("free_blocks", inputs, hint=_ITERABLE_HINT):
            pool.free_blocks(iter([pool.blocks[i] for i in order]))
        expect_same(
            "pool state after free_blocks",
            inputs,
            _pool_state(reference),
            _pool_state(pool),
            "decrement ref_cnt; the blocks reaching 0 go back in the given order: those with no block_hash "
            "(every one when enable_caching is False) to the HEAD of the free queue, as one group "
            "(prepend_n), the cached ones to the TAIL (append_n). " + _ITERABLE_HINT,
        )
        num_cases += 1
    _check_null_and_double_free(free_blocks)
    passed("check_free_blocks", num_cases + 2)


_ITERABLE_HINT = ("ordered_blocks is any iterable, possibly one that can be walked only once (the manager passes "
                  "reversed(blocks)): walk it once, with no len() and no indexing")


def _check_null_and_double_free(free_blocks: Callable) -> None:
    """The null block is skipped (vLLM) or refused with ValueError; a double free must not queue a block twice."""
    pool = _pool_with("free_blocks", free_blocks, 4)
    for what, blocks, hint in (
        ("freeing the null block", lambda: [pool.null_block],
         "block 0 is never handed out and its ref_cnt is not kept: skip it (vLLM) or raise ValueError"),
        ("freeing a block twice", lambda: [pool.blocks[1]],
         "a block with ref_cnt 0 is already in the free queue: raise ValueError, never queue it twice"),
    ):
        if what == "freeing a block twice":  # block 1 handed out, then freed once (by the reference)
            BlockPool.free_blocks(pool, pool.get_new_blocks(1))
        before = _pool_state(pool)
        inputs = {"ordered_blocks": [f"block {b.block_id} (ref_cnt {b.ref_cnt})" for b in blocks()],
                  "free queue before": before["free_queue"]}
        with calling("free_blocks", inputs, hint=hint), contextlib.suppress(ValueError):
            pool.free_blocks(blocks())
        after = _pool_state(pool)
        expect_equal(f"the free queue after {what}", inputs, before["free_queue"], after["free_queue"], hint)
        if what == "freeing the null block":
            expect_equal("the null block's ref_cnt", inputs, 0, pool.null_block.ref_cnt, hint)


# ---------------------------------------------------------------- the KV cache manager
def _request(request_id: str, num_prompt_tokens: int) -> Request:
    return Request(request_id, list(range(1, num_prompt_tokens + 1)), SamplingParams(max_tokens=4))


def _manager_state(manager: KVCacheManager, request_ids: list[str]) -> dict[str, Any]:
    """Block ids per request, the requests with an entry, and the pool (read tolerantly: a learner's table that
    holds something other than blocks is shown, not crashed on)."""
    return {
        "block_ids": {rid: _ids(manager.req_to_blocks.get(rid, [])) for rid in request_ids},
        "requests in req_to_blocks": sorted(map(str, manager.req_to_blocks)),
        **_pool_state(manager.block_pool),
    }


# The fixed case (block_size 4, 5 usable blocks): ("alloc", request, prompt length, num_new_tokens, hit block ids)
# or ("free", request). r1 and r3 start with prefix hits (num_new_computed_tokens = 4 per hit block); r2's
# first allocation is refused; r3's hit sits in the free queue (ref_cnt 0), so it is not a free block for r3;
# r4 is a prompt computed in chunks.
_FIXED_ALLOCATIONS: list[tuple] = [
    ("alloc", "r0", 5, 5, []), ("alloc", "r1", 7, 3, [1]), ("alloc", "r2", 13, 13, []), ("alloc", "r0", 5, 1, []),
    ("free", "r0"), ("alloc", "r3", 9, 5, [2]), ("alloc", "r2", 13, 13, []), ("alloc", "r1", 7, 1, []),
    # chunked prefill: a 10-token prompt computed 3, then 4 tokens at a time (the blocks follow the chunks)
    ("free", "r3"), ("alloc", "r4", 10, 3, []), ("alloc", "r4", 10, 4, []),
]


def _random_allocations(rng: random.Random, block_size: int, num_gpu_blocks: int) -> list[tuple]:
    """Random steps; the first allocation of a request may take some blocks another one holds, or that sit
    in the free queue, as prefix hits (what `get_computed_blocks` would have found)."""
    ops, prompts, started, finished = [], {}, set(), set()
    for step in range(8):
        live = [rid for rid in prompts if rid not in finished]
        if live and rng.random() < 0.15:
            rid = rng.choice(live)
            ops.append(("free", rid))
            finished.add(rid)
            continue
        if not live or rng.random() < 0.4:
            rid = f"r{step}"
            prompts[rid] = rng.randint(1, 3 * block_size)
            live.append(rid)
        rid = rng.choice(live)
        ops.append(("alloc", rid, prompts[rid], None, "maybe hits" if rid not in started else []))
        started.add(rid)
    return ops


def _hit_candidates(manager: KVCacheManager, request_id: str) -> list[int]:
    """Blocks a prefix hit could resolve to: another request's blocks, or blocks in the free queue."""
    held = [i for rid, blocks in manager.req_to_blocks.items() if rid != request_id for i in manager.get_block_ids(rid)]
    return list(dict.fromkeys(held + manager.block_pool.free_block_ids()))


@graded
def check_allocate_slots(allocate_slots: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in [-1, *seeds]:
        rng = random.Random(seed)
        block_size = 4 if seed < 0 else rng.choice([1, 2, 4, 16])
        num_gpu_blocks = 6 if seed < 0 else rng.randint(2, 12)
        reference = KVCacheManager(num_gpu_blocks, block_size)
        manager = KVCacheManager(num_gpu_blocks, block_size)
        manager.allocate_slots = types.MethodType(allocate_slots, manager)
        ops = _FIXED_ALLOCATIONS if seed < 0 else _random_allocations(rng, block_size, num_gpu_blocks)
        _replay_allocations(reference, manager, ops, rng, {"block_size": block_size, "num_gpu_blocks": num_gpu_blocks})
        num_cases += 1
    passed("check_allocate_slots", num_cases)


def _allocate_hint(expected: Any, got: Any, held: list[int], hit_ids: list[int], tokens: tuple[int, int, int],
                   block_size: int) -> str:
    """Say which part of allocate_slots' contract the return value breaks, with this call's numbers."""
    computed, hit_tokens, new = tokens
    total = computed + hit_tokens + new
    cover = (f"after the call the request's blocks must cover every token it will hold in the cache: here "
             f"{total} = {computed} computed before + {hit_tokens} from the hits (num_new_computed_tokens) + {new} "
             f"new, in blocks of {block_size}, a partly filled last block counting whole; the {len(held)} block(s) "
             f"it holds and its {len(hit_ids)} hit(s) count first")
    if expected is None and got is not None:
        return ("the pool cannot supply this call: return None and change nothing. Compare the new blocks needed "
                "with the free blocks less the hits that sit in the free queue (ref_cnt 0): touching a hit takes "
                "it out of the free queue, so it is not free for this request's new blocks")
    if expected is not None and got is None:
        return (f"enough blocks are free for this call, so do not refuse it. {cover}; a hit that another request "
                "holds (ref_cnt > 0) is not in the free queue and costs nothing")
    if isinstance(got, list) and isinstance(expected, list):
        if got == held + hit_ids + expected or got == hit_ids + expected:
            return "return only the NEW blocks (maybe []): not the blocks held before, not the hits"
        if len(got) != len(expected):
            return f"{len(got)} new block(s), the reference allocates {len(expected)}: {cover}"
        return ("the right number of new blocks, but not the reference's: new blocks come from the head of the "
                "free queue, after the hits have been touched (a hit with ref_cnt 0 leaves the free queue when "
                "touched, so it can never also be handed out as a new block)")
    return "return only the NEW blocks (a list, maybe []), or None when too few blocks are free"


_ALLOCATE_HINT = ("decide first, change after: the new blocks needed must fit in the free blocks less the hits "
                  "that sit in the free queue (ref_cnt 0), which touching them takes out of it")


def _replay_allocations(reference: KVCacheManager, manager: KVCacheManager, ops: list[tuple],
                        rng: random.Random, inputs: dict[str, Any]) -> None:
    block_size = reference.block_size
    requests: dict[str, tuple[Request, Request]] = {}
    inputs["calls so far"] = []
    for op in ops:
        if op[0] == "free":
            inputs["calls so far"].append(f"free({op[1]})  (the reference's)")
            inputs["this call"] = inputs["calls so far"][-1]
            reference.free(op[1])
            with calling("allocate_slots", inputs,
                         hint="the reference's free() could not give back what your allocate_slots recorded: "
                              "req_to_blocks[request_id] must be the request's KVCacheBlock objects, in order"):
                manager.free(op[1])
            continue
        _, rid, prompt_len, num_new, hit_ids = op
        if rid not in requests:
            requests[rid] = (_request(rid, prompt_len), _request(rid, prompt_len))
        ref_req, lab_req = requests[rid]
        if hit_ids == "maybe hits":   # a random first allocation: perhaps some prefix hits
            candidates = _hit_candidates(reference, rid)
            max_hits = min(len(candidates), (ref_req.num_tokens - 1) // block_size)
            hit_ids = rng.sample(candidates, rng.randint(0, max_hits)) if max_hits and rng.random() < 0.6 else []
        num_hit_tokens = len(hit_ids) * block_size
        remaining = ref_req.num_tokens - ref_req.num_computed_tokens - num_hit_tokens  # 1 for a decode step
        if num_new is None:
            num_new = rng.randint(1, remaining) if remaining > 1 and rng.random() < 0.4 else remaining
        inputs["calls so far"].append(
            f"allocate_slots({rid}, num_new_tokens={num_new}, num_new_computed_tokens={num_hit_tokens}, "
            f"new_computed_blocks=blocks {hit_ids}) with num_computed_tokens={ref_req.num_computed_tokens}"
            + (f" (hit ref_cnts {[reference.block_pool.blocks[i].ref_cnt for i in hit_ids]})" if hit_ids else ""))
        held_before = reference.get_block_ids(rid)
        inputs["this call"] = (f"{inputs['calls so far'][-1]}; {rid} held blocks {held_before}, free queue "
                               f"{reference.block_pool.free_block_ids()}")
        expected = _ids(reference.allocate_slots(ref_req, num_new, num_hit_tokens,
                                                 [reference.block_pool.blocks[i] for i in hit_ids]))
        with calling("allocate_slots", inputs, expected=expected, hint=_ALLOCATE_HINT):
            got = _ids(manager.allocate_slots(lab_req, num_new, num_hit_tokens,
                                              [manager.block_pool.blocks[i] for i in hit_ids]))
        expect_equal("allocate_slots return value", inputs, expected, got,
                     _allocate_hint(expected, got, held_before, hit_ids,
                                    (ref_req.num_computed_tokens, num_hit_tokens, num_new), block_size))
        expect_same("manager state after allocate_slots", inputs,
                     _manager_state(reference, list(requests)), _manager_state(manager, list(requests)),
                     "afterwards the request's blocks are those it held, then the hits (touched: one more "
                     "reference each), then the new blocks; None changes nothing, not even an empty "
                     "req_to_blocks entry")
        if expected is not None:
            for req in (ref_req, lab_req):
                req.num_computed_tokens += num_hit_tokens + num_new
                if req.num_computed_tokens == req.num_tokens:  # all computed: a token is sampled
                    req.append_output_token_ids(7)


PHASE = Phase("01_paged_kv", (
    Exercise("FreeKVCacheBlockQueue", check_free_block_queue, points=4, grade_id="test-free-block-queue",
             part="FreeKVCacheBlockQueue"),
    Exercise("get_new_blocks", check_get_new_blocks, points=2, grade_id="test-get-new-blocks", part="get_new_blocks"),
    Exercise("free_blocks", check_free_blocks, points=2, grade_id="test-free-blocks", part="free_blocks"),
    Exercise("allocate_slots", check_allocate_slots, points=3, grade_id="test-allocate-slots", part="allocate_slots",
             design="allocate_slots' admission test and order of operations (what to count, what to check before "
                    "any state changes) from its coverage and all-or-nothing contract"),
))
