"""Prefix caching behaves as vLLM v0.33.0 end to end (issue 24, items 6 and 7).

* A request asking for `prompt_logprobs` never reads the prefix cache (vLLM: `SamplingParams` sets
  `skip_reading_prefix_cache`, `KVCacheManager.get_computed_blocks` returns no hits), so a prompt run twice
  gets all its prompt logprobs both times. It still writes its blocks for others.
* Prefix-cache statistics count a request's lookup once, when the scheduler admits it
  (`Scheduler.schedule` -> `KVCacheManager.record_prefix_cache_stats`), not every step it waits.
"""

from __future__ import annotations

import pytest

from mini import LLM, SamplingParams

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


def test_prompt_logprobs_skip_reading_the_prefix_cache_but_others_still_hit():
    llm = LLM(enable_prefix_caching=True, block_size=4)
    prompt = {"prompt_token_ids": [(5 * i + 3) % 200 + 1 for i in range(40)]}
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    first, second = (llm.generate(prompt, with_logprobs, use_tqdm=False)[0] for _ in range(2))
    assert len(first.prompt_logprobs) == len(second.prompt_logprobs) == 40
    assert second.num_cached_tokens == 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    stats = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    assert (stats.requests, stats.queries) == (0, 0)          # skipped lookups are not counted
    # Its blocks were written to the cache all the same: a plain request hits them.
    plain = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)[0]
    assert plain.num_cached_tokens == 36
    stats = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (1, 40, 36)


def test_prefix_cache_stats_count_each_request_once_however_long_it_waits():
    # 5 usable blocks of 4 slots: while one request runs (3 to 5 blocks), the next cannot be admitted, so it
    # is looked up in the cache at every step it waits; only its admission counts.
    llm = LLM(enable_prefix_caching=True, block_size=4, num_gpu_blocks_override=6)
    manager = llm.llm_engine.scheduler.kv_cache_manager
    lookups = []
    get_computed_blocks = manager.get_computed_blocks
    manager.get_computed_blocks = lambda request: lookups.append(request.request_id) or get_computed_blocks(request)
    prompts = [{"prompt_token_ids": [(11 * i + j) % 200 + 1 for j in range(9)]} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    assert len(lookups) > 3, "the workload was meant to make requests wait"
    stats = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.preempted_requests) == (3, 3 * 9, 0)
