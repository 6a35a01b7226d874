"""Prefix caching as vLLM v1 does it: chained full-block hashes, cache salt, hits, free order, lazy
eviction, failed allocations, n > 1, preemption, counters, and a property-based check of the invariants.

The scenarios follow vLLM's tests/v1/core/test_prefix_caching.py (a 55-token prompt at block size 16,
a second request sharing 48 tokens, ...); the numbers here are mini's own.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.core import kv_cache_utils
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.kv_cache_utils import (
    DEFAULT_NONE_HASH_SEED,
    get_hash_function,
    hash_block_tokens,
    hash_request_tokens,
    init_none_hash,
    resolve_none_hash_seed,
    sha256,
    xxhash,
)
from mini.core.request import Request, RequestStatus
from mini.core.sched.scheduler import Scheduler
from mini.sampling_params import RequestOutputKind
from tests.core.test_scheduler import FakeRunner, make_config
from tests.engine.test_exactness import SETTINGS

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

BLOCK = 16
COMMON = list(range(1, 49))                  # 3 full blocks shared by the first two requests


def request(request_id: str, prompt: list[int], max_tokens: int = 16, cache_salt: str | None = None) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), cache_salt=cache_salt)


def schedule_new(manager: KVCacheManager, req: Request) -> list[int]:
    """What the scheduler does for a waiting request: look up hits, then allocate the rest."""
    hits, num_hit_tokens = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, req.num_tokens - num_hit_tokens, num_hit_tokens, hits) is not None
    manager.record_prefix_cache_stats(req, num_hit_tokens)    # the scheduler counts admitted lookups
    req.num_computed_tokens = req.num_tokens
    return [block.block_id for block in hits]


def free_queue(manager: KVCacheManager) -> list[int]:
    return manager.block_pool.free_block_ids()


# ---------------------------------------------------------------- hashing
def test_hash_block_tokens_chains_and_uses_none_hash_for_the_first_block():
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    assert first == sha256((kv_cache_utils.NONE_HASH, (1, 2, 3, 4), None))
    assert first == hash_block_tokens(sha256, None, (1, 2, 3, 4))
    second = hash_block_tokens(sha256, first, [5, 6, 7, 8])
    assert second != hash_block_tokens(sha256, None, [5, 6, 7, 8])   # same tokens, other prefix: other hash
    assert hash_block_tokens(sha256, None, [1, 2, 3, 4], (("cache_salt", "s"),)) != first
    assert get_hash_function("sha256") is sha256 and EngineConfig().prefix_caching_hash_algo == "sha256"
    for wrong in ("md5", "builtin"):          # vLLM offers sha256, sha256_cbor, xxhash, xxhash_cbor only
        with pytest.raises(ValueError, match="prefix_caching_hash_algo must be one of"):
            get_hash_function(wrong)
        with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
            EngineConfig(prefix_caching_hash_algo=wrong)


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash", "xxhash_cbor"])
def test_optional_hash_algorithms_work_or_name_the_missing_package(algo):
    try:
        hash_function = get_hash_function(algo)
    except ValueError as error:             # offline without cbor2 / xxhash: a clear message
        assert algo in str(error) and "package" in str(error) and "sha256" in str(error)
        with pytest.raises(ValueError, match=algo):
            KVCacheManager(4, 4, enable_caching=True, hash_algo=algo)
        return
    assert isinstance(hash_block_tokens(hash_function, None, [1, 2]), bytes)


def test_none_hash_is_a_fixed_sha256_seed_unless_pythonhashseed_or_xxhash(monkeypatch):
    """vLLM v0.33.0 `init_none_hash`: sha256(\"vllm-none-hash\") by default, so processes agree; PYTHONHASHSEED
    overrides it; the non-cryptographic xxhash gets a random per-process seed."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    try:
        init_none_hash(sha256)
        assert kv_cache_utils.NONE_HASH == sha256(DEFAULT_NONE_HASH_SEED) == sha256("vllm-none-hash")
        first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
        init_none_hash(sha256)
        assert hash_block_tokens(sha256, None, [1, 2, 3, 4]) == first         # reproducible
        assert resolve_none_hash_seed(xxhash) != resolve_none_hash_seed(xxhash)  # random for xxhash
        monkeypatch.setenv("PYTHONHASHSEED", "42")
        assert resolve_none_hash_seed(xxhash) == "42"
        init_none_hash(sha256)
        assert sha256("42") == kv_cache_utils.NONE_HASH
    finally:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        init_none_hash(sha256)


def test_only_full_blocks_are_hashed_and_the_salt_changes_the_whole_chain():
    tokens = list(range(55))
    hashes = hash_request_tokens(BLOCK, tokens)
    assert len(hashes) == 3                                   # 55 tokens at block 16: 3 full blocks
    assert hashes[1] == hash_block_tokens(sha256, hashes[0], tokens[16:32])
    salted = hash_request_tokens(BLOCK, tokens, cache_salt="tenant-a")
    # vLLM's generate_block_hash_extra_keys: the tagged pair ("cache_salt", salt), in block 0 only.
    assert salted[0] == hash_block_tokens(sha256, None, tokens[:16], (("cache_salt", "tenant-a"),))
    assert salted[1] == hash_block_tokens(sha256, salted[0], tokens[16:32], None)
    assert not set(salted) & set(hashes)
    known = hashes[:1]
    assert hash_request_tokens(BLOCK, tokens, known_hashes=known) is known and known == hashes


# ---------------------------------------------------------------- the vLLM scenarios
def test_prefill_hits_ref_counts_and_free_order():
    manager = KVCacheManager(num_gpu_blocks=11, block_size=BLOCK, enable_caching=True)
    pool = manager.block_pool
    first = request("0", COMMON + [3] * 7)                    # 55 tokens
    assert schedule_new(manager, first) == []
    assert manager.get_block_ids("0") == [1, 2, 3, 4]
    assert [pool.blocks[i].block_hash is not None for i in (1, 2, 3, 4)] == [True, True, True, False]
    assert len(manager.req_to_block_hashes["0"]) == 3

    second = request("1", COMMON + [4] * 5)                   # shares 48 tokens
    assert schedule_new(manager, second) == [1, 2, 3]
    assert second.num_tokens - 48 == 5 and manager.get_block_ids("1") == [1, 2, 3, 5]
    assert [pool.blocks[i].ref_cnt for i in range(1, 6)] == [2, 2, 2, 1, 1]
    stats = manager.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 55 + 53, 48)

    manager.free(first)
    # Only its private last block is free; it holds no hash, so it goes to the HEAD (vLLM v0.33.0).
    assert free_queue(manager) == [4, 6, 7, 8, 9, 10]
    manager.free(second)
    # Each request returns its blocks last-first: the unhashed 5 to the head, the cached 3, 2, 1 to the tail,
    # so the shared prefix's head is evicted last and the empty blocks are reused before any cached one.
    assert free_queue(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert len(pool.cached_block_hash_to_block) == 3          # lazy: freed blocks keep their hashes


def test_eviction_takes_the_free_queue_head_and_drops_hashes_lazily():
    manager = KVCacheManager(num_gpu_blocks=11, block_size=BLOCK, enable_caching=True)
    pool = manager.block_pool
    for req in (request("0", COMMON + [3] * 7), request("1", COMMON + [4] * 5)):
        schedule_new(manager, req)
    manager.free("0")
    manager.free("1")
    # A 7-block unrelated request takes the head: 5, 4, 6..10 (no hashes there): the prefix survives.
    other = request("2", [99] * (7 * BLOCK - 1))
    assert schedule_new(manager, other) == []
    assert manager.get_block_ids("2") == [5, 4, 6, 7, 8, 9, 10]
    assert free_queue(manager) == [3, 2, 1]
    assert [pool.blocks[i].block_hash is not None for i in (1, 2, 3)] == [True, True, True]
    # The next block popped is 3, the prefix's LAST block: its hash goes, blocks 1 and 2 stay hits.
    grow = request("3", [98] * 5)
    schedule_new(manager, grow)
    assert manager.get_block_ids("3") == [3]
    assert pool.blocks[3].block_hash is None
    again = request("4", COMMON + [5])
    hits, num_hit_tokens = manager.get_computed_blocks(again)
    assert [b.block_id for b in hits] == [1, 2] and num_hit_tokens == 32


def test_salted_request_misses_unsalted_blocks_and_hits_its_own():
    manager = KVCacheManager(num_gpu_blocks=20, block_size=BLOCK, enable_caching=True)
    schedule_new(manager, request("plain", COMMON + [7]))
    assert manager.get_computed_blocks(request("salted", COMMON + [7], cache_salt="tenant-b")) == ([], 0)
    schedule_new(manager, request("salted", COMMON + [7], cache_salt="tenant-b"))
    assert len(schedule_new(manager, request("same-salt", COMMON + [8], cache_salt="tenant-b"))) == 3
    assert manager.get_computed_blocks(request("other-salt", COMMON + [8], cache_salt="tenant-c")) == ([], 0)


def test_never_the_whole_prompt_and_a_failed_allocation_changes_no_ref_count():
    manager = KVCacheManager(num_gpu_blocks=6, block_size=4, enable_caching=True)
    pool = manager.block_pool
    running = request("running", list(range(8)))             # blocks 1, 2 (cached, in use)
    schedule_new(manager, running)
    finished = request("finished", list(range(8)) + [50, 51, 52, 53, 54])
    schedule_new(manager, finished)                           # hits 1, 2; new blocks 3, 4
    manager.free(finished)                                    # 3 (cached) and 4 back in the free queue
    # A prompt that is exactly cached: the last token is recomputed, so its block is not a hit.
    exact = request("exact", list(range(8)) + [50, 51, 52, 53])
    hits, num_hit_tokens = manager.get_computed_blocks(exact)
    assert [b.block_id for b in hits] == [1, 2] and num_hit_tokens == 8
    # 3 hits (2 in use, 1 free) + 3 new blocks needed, but only 2 other free blocks: refused.
    big = request("big", list(range(8)) + [50, 51, 52, 53] + [60] * 10)
    hits, num_hit_tokens = manager.get_computed_blocks(big)
    assert [b.block_id for b in hits] == [1, 2, 3]
    before = ([b.ref_cnt for b in pool.blocks], free_queue(manager), dict(pool.cached_block_hash_to_block))
    assert manager.allocate_slots(big, big.num_tokens - num_hit_tokens, num_hit_tokens, hits) is None
    assert ([b.ref_cnt for b in pool.blocks], free_queue(manager), dict(pool.cached_block_hash_to_block)) == before
    assert manager.get_block_ids("big") == []


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use():
    manager = KVCacheManager(num_gpu_blocks=8, block_size=4, enable_caching=True)
    req = request("a", list(range(9)))
    schedule_new(manager, req)
    assert manager.reset_prefix_cache() is False and len(manager.block_pool.cached_block_hash_to_block) == 2
    manager.free(req)
    assert manager.reset_prefix_cache() is True
    assert manager.block_pool.cached_block_hash_to_block == {}
    assert all(block.block_hash is None for block in manager.block_pool.blocks)
    assert manager.prefix_cache_stats.reset and manager.prefix_cache_stats.queries == 0


# ---------------------------------------------------------------- the engine
def shared_prefix_prompts(vocab_size: int, seed: int = 3) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    system = torch.randint(0, vocab_size, (21,), generator=generator).tolist()
    tails = [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in (1, 4, 9, 13, 2, 6)]
    return [system + tail for tail in tails] + [system[:8], system + tails[2]]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_outputs_identical_with_caching_on_and_off(tiny_llama_dir, setting):
    prompts = [{"prompt_token_ids": p} for p in shared_prefix_prompts(211)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    priority = [i % 3 for i in range(len(prompts))] if setting == "priority" else None
    results = {}
    for caching in (False, True):
        llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, enable_prefix_caching=caching,
                  **SETTINGS[setting])
        outputs = llm.generate(prompts, params, use_tqdm=False, priority=priority)
        # A second round: everything finished, so every full prompt block is a free cached block now.
        outputs += llm.generate(prompts, params, use_tqdm=False, priority=priority)
        results[caching] = [o.outputs[0].token_ids for o in outputs]
        pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_usable_blocks, "KV blocks leaked"
        stats = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
        if caching:
            assert stats.hits > 0 and any(o.num_cached_tokens > 0 for o in outputs)
        else:
            assert stats.queries == 0 and all(o.num_cached_tokens == 0 for o in outputs)
    assert results[True] == results[False]


def test_n_samples_prefill_the_prompt_once(tiny_llama_dir):
    prompt = {"prompt_token_ids": [(7 * i) % 211 for i in range(55)]}
    params = SamplingParams(n=4, temperature=0.8, seed=7, max_tokens=3, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)   # the finished output holds all 4
    computed, texts = {}, {}
    for caching in (False, True):
        llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, enable_prefix_caching=caching)
        engine = llm.llm_engine
        engine.add_request("p", prompt, params)
        traces = []
        engine.add_step_observer(traces.append)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            computed.setdefault(caching, traces[0].scheduler_output.total_num_scheduled_tokens)
            for output in outputs:
                if output.finished:
                    texts[caching] = sorted(tuple(c.token_ids) for c in output.outputs)
    assert computed[False] == 4 * 55
    assert computed[True] == 55 + 3 * (55 - 48)       # the children hit the first child's 3 full blocks
    assert texts[True] == texts[False] and len(texts[True]) == 4   # seeded samples: the same either way


def test_preempted_request_resumes_from_its_own_cached_blocks(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, enable_prefix_caching=True,
              block_size=4, num_gpu_blocks_override=12, max_num_seqs=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for index in range(3):
        engine.add_request(str(index), {"prompt_token_ids": [(index * 31 + i) % 211 for i in range(10)]}, params)
    preempted, resumed_hits = set(), []
    traces = []
    engine.add_step_observer(traces.append)
    while engine.has_unfinished_requests():
        engine.step()
        out = traces[-1].scheduler_output
        preempted |= out.preempted_req_ids
        resumed_hits += [new.num_computed_tokens for new in out.scheduled_new_reqs if new.req_id in preempted]
    assert preempted, "the pool was meant to be too small"
    assert resumed_hits and max(resumed_hits) > 0, "a resumed request should hit its own blocks"


def test_cache_salt_num_cached_tokens_stats_and_reset(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, enable_prefix_caching=True,
              prefix_caching_hash_algo="sha256")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    ids = list(range(1, 40))
    first = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 32
    salted = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], params, use_tqdm=False)[0]
    assert salted.num_cached_tokens == 0
    salted = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], params, use_tqdm=False)[0]
    assert salted.num_cached_tokens == 32
    stats, pool = engine.get_scheduler_stats(), engine.snapshot_pool()
    assert (stats.prefix_cache_stats.queries, stats.prefix_cache_stats.hits) == (4 * 39, 64)
    assert len(pool.cached_block_ids) == 4 and all(pool.block_hashes[b] for b in pool.cached_block_ids)
    with pytest.raises(TypeError, match="cache_salt"):
        llm.generate([{"prompt_token_ids": ids, "cache_salt": 3}], params, use_tqdm=False)

    engine.add_request("busy", {"prompt_token_ids": ids}, params)
    engine.step()
    assert llm.reset_prefix_cache() is False               # a request holds blocks
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.reset_prefix_cache() is True
    assert engine.snapshot_pool().cached_block_ids == [] and engine.get_scheduler_stats().prefix_cache_stats.reset
    assert llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].num_cached_tokens == 0


def test_text_prompt_with_cache_salt():
    llm = LLM(enable_prefix_caching=True, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    text = "The quick brown fox jumps over the lazy dog and keeps running"
    plain = [llm.generate(text, params, use_tqdm=False)[0] for _ in range(2)]
    salted = [llm.generate({"prompt": text, "cache_salt": "s"}, params, use_tqdm=False)[0] for _ in range(2)]
    assert plain[1].num_cached_tokens > 0 and salted[0].num_cached_tokens == 0
    assert salted[1].num_cached_tokens == plain[1].num_cached_tokens
    assert salted[1].outputs[0].token_ids == plain[0].outputs[0].token_ids


# ---------------------------------------------------------------- invariants under random workloads
PREFIXES = [list(range(1, 13)), [5] * 7, list(range(40, 49))]

workload = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),                   # which shared prefix
        st.lists(st.integers(1, 60), min_size=1, max_size=5),  # private tail
        st.sampled_from([None, None, "salt"]),               # cache salt
        st.integers(1, 6),                                   # max_tokens
        st.integers(0, 6),                                   # arrival step
        st.one_of(st.none(), st.integers(0, 10)),            # abort step
    ),
    min_size=1, max_size=7,
)


def check_invariants(manager: KVCacheManager, scheduler: Scheduler, runner: FakeRunner,
                     prefix_of_hash: dict[bytes, list[int]]) -> None:
    pool = manager.block_pool
    holders = [0] * pool.num_gpu_blocks
    for request_id in scheduler.requests:
        for block_id in manager.get_block_ids(request_id):
            holders[block_id] += 1
    assert [b.ref_cnt for b in pool.blocks[1:]] == holders[1:], "ref counts != number of holders"
    assert sorted(pool.free_block_ids()) == [b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0]
    for block in pool.cached_blocks():
        assert block.block_hash is not None
        tokens = prefix_of_hash[block.block_hash]         # a prefix some request really had
        size = manager.block_size
        stored = runner.kv_slots[block.block_id * size:(block.block_id + 1) * size]
        assert stored == tokens[-size:], f"block {block.block_id} does not hold the tokens of its hash"
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash
    stats = manager.prefix_cache_stats
    assert 0 <= stats.hits <= stats.queries


@settings(max_examples=int(os.environ.get("MINI_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(specs=workload, block_size=st.sampled_from([2, 4]), spare_blocks=st.integers(0, 5),
       budget=st.integers(2, 24), hash_algo=st.sampled_from(["sha256"]))
def test_random_shared_prefix_workloads_keep_the_cache_consistent(specs, block_size, spare_blocks, budget,
                                                                  hash_algo):
    longest = max(len(PREFIXES[p]) + len(tail) + max_tokens for p, tail, _, max_tokens, _, _ in specs)
    num_gpu_blocks = -(-longest // block_size) + spare_blocks + 1
    manager = KVCacheManager(num_gpu_blocks, block_size, enable_caching=True, hash_algo=hash_algo)
    scheduler = Scheduler(make_config(max_num_batched_tokens=budget, max_num_seqs=4), manager)
    runner = FakeRunner(num_gpu_blocks, block_size)
    hash_function = get_hash_function(hash_algo)
    requests = [Request(f"r{i}", PREFIXES[p] + tail, SamplingParams(max_tokens=max_tokens), cache_salt=salt)
                for i, (p, tail, salt, max_tokens, _, _) in enumerate(specs)]
    arrivals = {i: spec[4] for i, spec in enumerate(specs)}
    aborts = {f"r{i}": spec[5] for i, spec in enumerate(specs) if spec[5] is not None}
    prefix_of_hash: dict[bytes, list[int]] = {}
    for step in range(400):
        for index, arrival in arrivals.items():
            if arrival == step:
                scheduler.add_request(requests[index])
        scheduler.finish_requests([r for r, s in aborts.items() if s == step and r in scheduler.requests],
                                  RequestStatus.FINISHED_ABORTED)
        if not scheduler.has_unfinished_requests() and step > 6:
            break
        for req in scheduler.requests.values():
            hashes = hash_request_tokens(block_size, req.all_token_ids, req.cache_salt, hash_function)
            for index, block_hash in enumerate(hashes):
                prefix_of_hash[block_hash] = req.all_token_ids[:(index + 1) * block_size]
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner.execute(out))
        check_invariants(manager, scheduler, runner, prefix_of_hash)
    assert not scheduler.has_unfinished_requests()
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_usable_blocks, "KV blocks leaked"
    assert all(block.ref_cnt == 0 for block in manager.block_pool.blocks)
