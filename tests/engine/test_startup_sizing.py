"""Engine start-up: KV-cache sizing arithmetic, the profiling run, the policies, the log lines."""

from __future__ import annotations

import logging

import pytest

from mini.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from mini.engine.llm_engine import LLMEngine
from mini.worker.startup import (
    cpu_kv_budget_bytes,
    gpu_kv_budget_bytes,
    kv_cache_tokens,
    max_concurrency,
    num_blocks_for_budget,
)

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

MiB = 2**20


def test_blocks_for_budget_include_the_null_block_as_vllm():
    # vLLM v0.33.0 (kv_cache_planning.py, get_kv_cache_config_from_groups): available_memory // bytes_per_block,
    # and the block pool takes its null block out of that count: no extra block on top.
    assert num_blocks_for_budget(10 * 4096, 4096) == 10
    assert num_blocks_for_budget(10 * 4096 + 4095, 4096) == 10         # a partial block buys nothing
    assert num_blocks_for_budget(0, 4096) == 0
    with pytest.raises(ValueError, match="bytes_per_block"):
        num_blocks_for_budget(100, 0)


def test_gpu_budget_is_vllms_requested_minus_non_kv():
    # 80 GiB card at 0.9: 72 GiB requested; 16 GiB weights, 2 GiB activations, 1 GiB others -> 53 GiB
    GiB = 2**30
    assert gpu_kv_budget_bytes(80 * GiB, 0.9, 16 * GiB, 2 * GiB, 1 * GiB) == 53 * GiB
    assert gpu_kv_budget_bytes(8 * GiB, 0.5, 4 * GiB, 1 * GiB, 0) < 0


def test_cpu_budget_policy():
    assert cpu_kv_budget_bytes(None, 123) == DEFAULT_KV_CACHE_BYTES
    assert cpu_kv_budget_bytes(64 * 2**30, 100 * MiB) == DEFAULT_KV_CACHE_BYTES
    assert cpu_kv_budget_bytes(600 * MiB, 100 * MiB) == 200 * MiB      # half of 600, minus activations


def test_max_concurrency_and_tokens_are_vllms_log():
    # vLLM's get_max_concurrency_for_kv_cache_config: num_blocks (null block counted) / blocks per request
    assert max_concurrency(num_gpu_blocks=64, block_size=16, max_model_len=256) == 4.0
    assert max_concurrency(num_gpu_blocks=9, block_size=16, max_model_len=200) == pytest.approx(9 / 13)
    assert kv_cache_tokens(num_gpu_blocks=64, block_size=16, max_model_len=256) == 1024
    assert kv_cache_tokens(num_gpu_blocks=9, block_size=16, max_model_len=200) == int(9 / 13 * 200)


def test_engine_sizes_from_kv_cache_memory_bytes_and_logs(caplog):
    config = EngineConfig(max_model_len=256, kv_cache_memory_bytes=3 * MiB)
    with caplog.at_level(logging.INFO, logger="mini.engine"):
        engine = LLMEngine(config)
    per_block = engine.kv_bytes_per_block(engine.config, engine.hf_config)   # 49152 for the tiny model
    assert engine.num_gpu_blocks == 3 * MiB // per_block          # the null block is one of them (vLLM)
    pool = engine.scheduler.kv_cache_manager.block_pool
    assert pool.num_gpu_blocks == engine.num_gpu_blocks and pool.get_num_free_blocks() == engine.num_gpu_blocks - 1
    report = engine.startup_report
    assert report.policy == "kv_cache_memory_bytes" and report.profile_seconds == 0.0
    assert report.max_concurrency == pytest.approx(engine.num_gpu_blocks / 16)
    assert report.kv_cache_tokens == int(engine.num_gpu_blocks / 16 * 256)
    assert f"CPU KV cache size: {report.kv_cache_tokens:,} tokens, Maximum concurrency for 256 tokens" in caplog.text
    assert f"num_gpu_blocks: {engine.num_gpu_blocks} (the null block among them)" in caplog.text


def test_cpu_default_profiles_and_keeps_the_old_sizing(caplog):
    with caplog.at_level(logging.INFO, logger="mini.engine"):
        engine = LLMEngine(EngineConfig(max_num_seqs=4, max_model_len=128))
    report = engine.startup_report
    assert report.policy == "cpu_default" and report.profile_seconds > 0
    assert engine.num_gpu_blocks == 4 * (128 // 16) + 1     # capped at what 4 full-length requests use
    assert "Memory profiling took" in caplog.text


def test_override_wins_and_a_too_small_budget_is_refused():
    overridden = LLMEngine(EngineConfig(num_gpu_blocks_override=7, max_model_len=64))
    assert overridden.num_gpu_blocks == 7 and overridden.startup_report is None
    with pytest.raises(ValueError, match="max_model_len=1024"):
        LLMEngine(EngineConfig(kv_cache_memory_bytes=MiB))


def test_a_budget_of_exactly_one_request_is_one_block_short():
    # 256 tokens = 16 blocks of 16; 16 blocks' bytes buy 16 blocks, one of which is the null block (vLLM's count),
    # so one full-length request does not fit (mini's choice: the guard counts usable blocks); 17 blocks do.
    per_block = LLMEngine.kv_bytes_per_block(EngineConfig(), LLMEngine(EngineConfig(
        num_gpu_blocks_override=20, max_model_len=64)).hf_config)
    with pytest.raises(ValueError, match="16 blocks of 16 tokens, the null block among them"):
        LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory_bytes=16 * per_block))
    engine = LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory_bytes=17 * per_block))
    assert engine.num_gpu_blocks == 17
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
            EngineConfig(kv_cache_memory_bytes=bad)
    for bad in (0.0, 1.5, "0.9"):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            EngineConfig(gpu_memory_utilization=bad)


def test_llm_takes_the_sizing_arguments_as_vllm_does():
    from mini import LLM

    llm = LLM(max_model_len=256, kv_cache_memory_bytes=3 * MiB)
    engine = llm.llm_engine
    assert engine.config.kv_cache_memory_bytes == 3 * MiB
    assert engine.num_gpu_blocks == 3 * MiB // engine.kv_bytes_per_block(engine.config, engine.hf_config)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(gpu_memory_utilization=1.5)
