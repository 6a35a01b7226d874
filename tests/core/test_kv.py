"""Paged KV memory: the free-block queue, the block pool, the KV cache manager and prefix caching."""

from __future__ import annotations

import pytest

from mini.core.block_pool import BlockPool
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock, hash_block_tokens, sha256
from mini.core.request import Request, RequestStatus
from mini.sampling_params import SamplingParams


def make_request(request_id: str, prompt: list[int], max_tokens: int = 16) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_id=None)


def free_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [block.block_id for block in queue.get_all_free_blocks()]


# ---------------------------------------------------------------- FreeKVCacheBlockQueue
def test_free_queue_popleft_append_and_order():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert free_ids(queue) == [0, 1, 2, 3, 4]
    first = queue.popleft()
    assert first.block_id == 0 and first.prev_free_block is None and first.next_free_block is None
    assert [b.block_id for b in queue.popleft_n(2)] == [1, 2]
    assert queue.num_free_blocks == 2
    queue.append(first)
    assert free_ids(queue) == [3, 4, 0]
    queue.append_n([blocks[2], blocks[1]])
    assert free_ids(queue) == [3, 4, 0, 2, 1]
    assert queue.num_free_blocks == 5


def test_free_queue_remove_from_middle_head_and_tail():
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[3])
    assert free_ids(queue) == [0, 1, 2, 4, 5]
    queue.remove(blocks[0])
    queue.remove(blocks[5])
    assert free_ids(queue) == [1, 2, 4]
    assert queue.num_free_blocks == 3
    assert queue.popleft().block_id == 1
    queue.append(blocks[3])
    assert free_ids(queue) == [2, 4, 3]


def test_free_queue_errors():
    blocks = [KVCacheBlock(i) for i in range(2)]
    queue = FreeKVCacheBlockQueue(blocks)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])
    queue.popleft_n(2)
    with pytest.raises(ValueError, match="empty"):
        queue.popleft()
    with pytest.raises(ValueError, match="num_free_blocks"):
        queue.popleft_n(1)
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[1])


# ---------------------------------------------------------------- BlockPool
def test_fresh_pool_hands_out_1_2_3_and_never_the_null_block():
    pool = BlockPool(num_gpu_blocks=6, enable_caching=False)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 5
    got = pool.get_new_blocks(5)
    assert [b.block_id for b in got] == [1, 2, 3, 4, 5]
    assert all(b.ref_cnt == 1 for b in got)
    assert pool.get_num_free_blocks() == 0 and pool.get_usage() == 1.0
    with pytest.raises(ValueError, match="num_blocks"):
        pool.get_new_blocks(1)
    pool.free_blocks([pool.null_block])   # skipped, as vLLM's free_blocks: its ref_cnt is not kept
    assert pool.get_num_free_blocks() == 0 and not pool.null_block.ref_cnt
    pool.touch([pool.null_block])         # skipped too (vLLM's touch checks is_null first)
    assert pool.null_block.ref_cnt == 0 and pool.get_num_free_blocks() == 0


def test_pool_ref_counts_free_to_head_without_caching_and_double_free():
    pool = BlockPool(num_gpu_blocks=5)
    b1, b2, b3 = pool.get_new_blocks(3)
    pool.touch([b2])  # shared by a second owner
    assert b2.ref_cnt == 2
    pool.free_blocks([b3, b2, b1])
    assert b2.ref_cnt == 1 and b1.ref_cnt == 0 and b3.ref_cnt == 0
    # vLLM v0.33.0: with caching off every freed block goes to the HEAD, in the given order (reused first).
    assert free_ids(pool.free_block_queue) == [3, 1, 4]
    pool.free_blocks([b2])
    assert free_ids(pool.free_block_queue) == [2, 3, 1, 4]
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([b2])
    # Without caching the most recently freed block is handed out first (LIFO, vLLM's "GPU locality").
    assert [b.block_id for b in pool.get_new_blocks(2)] == [2, 3]


def test_cached_blocks_go_to_the_tail_uncached_to_the_head():
    """vLLM v0.33.0 BlockPool.free_blocks: a freed block without a hash is reused before any cached block."""
    manager = KVCacheManager(num_gpu_blocks=8, block_size=2, enable_caching=True)
    pool = manager.block_pool
    cached = make_request("cached", [1, 2, 3, 4, 5])       # blocks 1, 2 full (hashed), 3 partial
    manager.allocate_slots(cached, 5)
    manager.free(cached)                                   # reversed: 3 (no hash) -> head, 2, 1 -> tail
    assert free_ids(pool.free_block_queue) == [3, 4, 5, 6, 7, 2, 1]
    other = make_request("other", [9] * 10)                # needs 5 blocks: the cached prefix survives
    manager.allocate_slots(other, 10)
    assert manager.get_block_ids("other") == [3, 4, 5, 6, 7]
    again = make_request("again", [1, 2, 3, 4, 6])
    hits, num_hit_tokens = manager.get_computed_blocks(again)
    assert [b.block_id for b in hits] == [1, 2] and num_hit_tokens == 4


def test_pool_rejects_bad_size():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        BlockPool(1)


# ---------------------------------------------------------------- KVCacheManager
def test_worked_example_three_prompts_block_size_4():
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    prompts = {"r0": [1, 2, 3, 4, 5], "r1": [1, 6, 5, 7, 8, 9, 10], "r2": [1, 12, 13]}
    requests = {rid: make_request(rid, p) for rid, p in prompts.items()}
    for request in requests.values():
        new_blocks = manager.allocate_slots(request, request.num_tokens)
        assert new_blocks is not None
        request.num_computed_tokens = request.num_tokens
    assert manager.get_block_ids("r0") == [1, 2]
    assert manager.get_block_ids("r1") == [3, 4]
    assert manager.get_block_ids("r2") == [5]
    # One decode step: each request samples one token and computes it next step.
    for request in requests.values():
        request.append_output_token_ids(99)
        assert manager.allocate_slots(request, 1) == []  # 6, 8 and 4 tokens still fit
    assert manager.get_block_ids("r0") == [1, 2]
    assert manager.get_block_ids("r1") == [3, 4]
    assert manager.get_block_ids("r2") == [5]
    assert manager.block_pool.get_num_free_blocks() == 4


def test_allocate_none_changes_nothing_and_free_is_reversed_and_idempotent():
    manager = KVCacheManager(num_gpu_blocks=4, block_size=2)
    big = make_request("big", list(range(7)))
    assert manager.allocate_slots(big, 7) is None  # needs 4 blocks, 3 usable
    assert manager.get_block_ids("big") == [] and manager.block_pool.get_num_free_blocks() == 3
    request = make_request("r", list(range(5)))
    assert [b.block_id for b in manager.allocate_slots(request, 5)] == [1, 2, 3]
    manager.free(request)
    assert free_ids(manager.block_pool.free_block_queue) == [3, 2, 1]  # tail of the sequence first
    manager.free(request)
    assert manager.block_pool.get_num_free_blocks() == 3
    with pytest.raises(ValueError, match="num_new_tokens"):
        manager.allocate_slots(request, -1)


def test_allocate_grows_only_when_a_block_fills():
    manager = KVCacheManager(num_gpu_blocks=8, block_size=4)
    request = make_request("r", [1, 2, 3])
    assert len(manager.allocate_slots(request, 3)) == 1
    request.num_computed_tokens = 3
    request.append_output_token_ids(7)
    assert manager.allocate_slots(request, 1) == []      # token 4 fits in block 1
    request.num_computed_tokens = 4
    request.append_output_token_ids(8)
    assert [b.block_id for b in manager.allocate_slots(request, 1)] == [2]
    assert manager.num_blocks_needed(9) == 3


# ---------------------------------------------------------------- prefix caching
def test_hash_is_chained_and_deterministic():
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    assert isinstance(first, bytes) and first == hash_block_tokens(sha256, None, (1, 2, 3, 4))
    assert hash_block_tokens(sha256, first, [5, 6, 7, 8]) != hash_block_tokens(sha256, None, [5, 6, 7, 8])
    assert hash_block_tokens(sha256, None, [1, 2, 3, 5]) != first


def test_prefix_hit_touch_and_last_token_rule():
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4, enable_caching=True)
    pool = manager.block_pool
    first = make_request("a", list(range(10)))            # 2 full blocks + 2 tokens
    assert manager.get_computed_blocks(first) == ([], 0)
    manager.allocate_slots(first, 10)
    assert len(pool.cached_block_hash_to_block) == 2      # only full blocks are cached
    second = make_request("b", list(range(8)) + [50, 51, 52])
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert [b.block_id for b in hits] == [1, 2] and num_hit_tokens == 8
    manager.allocate_slots(second, 3, num_hit_tokens, hits)
    assert manager.get_block_ids("b") == [1, 2, 4]
    assert pool.blocks[1].ref_cnt == 2 and pool.blocks[2].ref_cnt == 2
    # A prompt that is exactly 2 full cached blocks: the block holding its last token is recomputed.
    exact = make_request("c", list(range(8)))
    hits, num_hit_tokens = manager.get_computed_blocks(exact)
    assert [b.block_id for b in hits] == [1] and num_hit_tokens == 4


def test_freed_cached_blocks_are_revived_or_evicted_lazily():
    manager = KVCacheManager(num_gpu_blocks=4, block_size=2, enable_caching=True)
    pool = manager.block_pool
    first = make_request("a", [1, 2, 3, 4, 5])
    manager.allocate_slots(first, 5)                      # blocks 1, 2 (full, cached), 3 (partial)
    manager.free(first)
    assert pool.get_num_free_blocks() == 3 and len(pool.cached_block_hash_to_block) == 2
    # Revive: a hit on free cached blocks takes them out of the free queue.
    again = make_request("b", [1, 2, 3, 4, 9])
    hits, num_hit_tokens = manager.get_computed_blocks(again)
    assert [b.block_id for b in hits] == [1, 2] and num_hit_tokens == 4
    manager.allocate_slots(again, 1, num_hit_tokens, hits)
    assert manager.get_block_ids("b") == [1, 2, 3]
    assert pool.get_num_free_blocks() == 0
    manager.free(again)
    # Evict: a different prompt needs all blocks; the cached hashes disappear as blocks are reused.
    other = make_request("c", [7, 7, 7, 7, 7, 7])
    assert manager.get_computed_blocks(other) == ([], 0)
    manager.allocate_slots(other, 6)
    assert manager.get_block_ids("c") == [3, 2, 1]       # freed in reverse: tail first
    hashes = manager.req_to_block_hashes["c"]
    assert set(pool.cached_block_hash_to_block) == set(hashes)


def test_allocation_counts_revived_hits_against_free_blocks():
    manager = KVCacheManager(num_gpu_blocks=3, block_size=2, enable_caching=True)
    first = make_request("a", [1, 2, 3])
    manager.allocate_slots(first, 3)
    manager.free(first)                                   # blocks 1 (cached) and 2 free
    second = make_request("b", [1, 2, 3, 4, 5])
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 2
    # 5 tokens need 3 blocks: 1 hit + 2 new, but only 1 other free block exists.
    assert manager.allocate_slots(second, 3, num_hit_tokens, hits) is None
    assert manager.block_pool.get_num_free_blocks() == 2 and hits[0].ref_cnt == 0


def test_request_status_helpers():
    request = make_request("r", [1])
    assert not request.is_finished() and request.get_finished_reason() is None
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    assert request.is_finished() and request.get_finished_reason() == "length"
    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_ABORTED) == "abort"
    with pytest.raises(ValueError, match="prompt_token_ids"):
        make_request("empty", [])
