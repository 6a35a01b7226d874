"""Engine start-up: KV-cache sizing arithmetic, the profiling run, the policies, the log lines."""

from __future__ import annotations

import logging

import pytest

from mini.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from mini.engine.llm_engine import LLMEngine
from mini.engine.startup import (
    cpu_kv_budget_bytes,
    gpu_kv_budget_bytes,
    max_concurrency,
    num_blocks_for_budget,
)

MiB = 2**20


def test_blocks_for_budget_counts_the_null_block_and_caps():
    assert num_blocks_for_budget(10 * 4096, 4096) == 11
    assert num_blocks_for_budget(10 * 4096 + 4095, 4096) == 11         # a partial block buys nothing
    assert num_blocks_for_budget(10 * 4096, 4096, max_useful_blocks=4) == 5
    assert num_blocks_for_budget(-5, 4096) == 1                         # nothing left: only the null block
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


def test_max_concurrency():
    assert max_concurrency(num_gpu_blocks=65, block_size=16, max_model_len=256) == 4.0
    assert max_concurrency(num_gpu_blocks=9, block_size=16, max_model_len=200) == pytest.approx(8 / 13)


def test_engine_sizes_from_kv_cache_memory_bytes_and_logs(caplog):
    config = EngineConfig(max_model_len=256, kv_cache_memory_bytes=3 * MiB)
    with caplog.at_level(logging.INFO, logger="mini.engine"):
        engine = LLMEngine(config)
    per_block = engine.kv_bytes_per_block(engine.config, engine.hf_config)   # 49152 for the tiny model
    assert engine.num_gpu_blocks == 3 * MiB // per_block + 1
    assert engine.scheduler.kv_cache_manager.block_pool.num_gpu_blocks == engine.num_gpu_blocks
    report = engine.startup_report
    assert report.policy == "kv_cache_memory_bytes" and report.profile_seconds == 0.0
    assert report.kv_cache_tokens == (engine.num_gpu_blocks - 1) * 16
    assert report.max_concurrency == pytest.approx((engine.num_gpu_blocks - 1) / 16)
    assert f"KV cache size: {report.kv_cache_tokens:,} tokens" in caplog.text
    assert "Maximum concurrency for 256 tokens per request" in caplog.text
    assert f"# KV blocks: {engine.num_gpu_blocks - 1}" in caplog.text


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
    assert engine.num_gpu_blocks == 3 * MiB // engine.kv_bytes_per_block(engine.config, engine.hf_config) + 1
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(gpu_memory_utilization=1.5)
