"""Engine start-up: a profiling run at the maximum batch, then the KV cache sized from what remains.

Mirrors vllm/v1/worker/gpu_worker.py (`Worker.determine_available_memory`: profile, then
`requested_memory - non_kv_memory`), vllm/v1/worker/gpu_model_runner.py (`profile_run` / `_dummy_run` at
`max_num_batched_tokens`), vllm/v1/core/kv_cache_planning.py (`get_kv_cache_config_from_groups`: bytes ->
blocks as `available_memory // bytes_per_block`, the null block among them; `_check_enough_kv_cache_memory`)
and vllm/v1/core/kv_cache_utils.py (`update_kv_cache_capacity`: the "GPU KV cache size: N tokens, Maximum
concurrency for L tokens per request: Cx" log line).

The policy (what `LLMEngine` calls when `num_gpu_blocks_override` is None):

* `kv_cache_memory_bytes` given: that many bytes of KV cache, no memory profiling (as vLLM: the user sized
  it; vLLM still runs its dummy forward once, mini skips it).
* CUDA: budget = ceil(`gpu_memory_utilization` x total GPU memory) - non-KV memory (weights + peak
  activations of the profiling run + memory outside torch's allocator), as vLLM's
  `requested_memory - non_kv_cache_memory` (`request_memory` in vllm/v1/worker/utils.py; `memory_profiling` in
  vllm/utils/mem_utils.py measures the non-KV part as the free memory consumed since the engine was created
  plus the activations' transient peak); `determine_num_gpu_blocks` is that arithmetic on measured numbers. vLLM
  v0.33.0 also subtracts an estimate of its CUDA graphs' memory (`profile_cudagraph_memory`,
  `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` on by default); mini does not (its decode-only graphs are small).
* CPU: there is no device memory to share and torch keeps no allocator statistics, so the budget is
  `DEFAULT_KV_CACHE_BYTES` (512 MiB) capped by half the machine's available RAM minus the profiled peak
  (the growth of the process' peak RSS during the profiling run: a lower bound, since the peak RSS only
  moves once it passes the process' earlier peak). The profiling run doubles as a warm-up. On CPU (only) the
  cache is also capped at what `max_num_seqs` sequences of `max_model_len` tokens can use, plus the null
  block: a laptop does not reserve gigabytes it can never fill. (mini's own policy: vLLM's CPU worker,
  `CPUWorker.determine_available_memory` in vllm/v1/worker/cpu_worker.py, reserves `gpu_memory_utilization`
  of the NUMA node's memory and gives the KV cache what the process' RSS leaves of it.)
* The blocks are `budget // bytes_per_block` and the null block 0 is ONE OF THEM, as in vLLM (the block pool
  takes it from the same count), so the usable blocks are one fewer. A budget of zero or less is refused
  (vLLM: "No available memory for the cache blocks").
* At least one full-length request must fit in the usable blocks (the null block excluded), else ValueError,
  as vLLM's `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_planning.py), which takes one block's bytes
  off the budget for the null block before comparing it with one `max_model_len` request's bytes
  ("To serve at least one request with the model's max seq len ...").
* The logged capacity is vLLM's: `num_gpu_blocks / cdiv(max_model_len, block_size)` requests, times
  `max_model_len` tokens (vLLM counts the null block in it too).
"""

from __future__ import annotations

import logging
import math
import resource
import time
from dataclasses import dataclass
from typing import Any

import torch

from mini.attention.metadata import build_attention_metadata
from mini.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from mini.core.block_pool import usable_blocks
from mini.model.llama import DecoderConfig
from mini.model.parallel_linear import kv_head_partition
from mini.utils import cdiv
from mini.worker.prepare_inputs import prepare_inputs

logger = logging.getLogger("mini.engine")

# CPU: the KV cache may take at most this fraction of the RAM available at start-up.
CPU_AVAILABLE_RAM_FRACTION = 0.5


def resolve_max_model_len(config: EngineConfig, hf_config: Any) -> int:
    """`config.max_model_len`, checked against the checkpoint's `max_position_embeddings` (its default when
    not given), as vLLM's `ModelConfig.get_and_verify_max_len` (vllm/config/model.py)."""
    model_limit = int(getattr(hf_config, "max_position_embeddings", 0) or 0)
    if config.max_model_len is None:
        if model_limit <= 0:
            raise ValueError("max_model_len must be given: the model config has no max_position_embeddings")
        return model_limit
    if model_limit and config.max_model_len > model_limit:
        raise ValueError(f"max_model_len ({config.max_model_len}) must be <= the model's "
                         f"max_position_embeddings ({model_limit})")
    return int(config.max_model_len)


def kv_bytes_per_block(config: EngineConfig, hf_config: Any, tensor_parallel_size: int = 1) -> int:
    """Bytes one KV block takes across all layers on one rank: 2 (K and V) x layers x block_size x kv_heads
    (this rank's share of them) x head_size x element size (vLLM: `AttentionSpec.page_size_bytes`)."""
    model_config = DecoderConfig.from_hf_config(hf_config)
    element_size = torch.empty((), dtype=config.torch_dtype).element_size()
    # This rank's KV heads (every rank holds as many; fewer heads than ranks: replicated), as the model builds them.
    kv_heads = kv_head_partition(model_config.num_key_value_heads, tensor_parallel_size, 0).num_kv_heads
    return 2 * model_config.num_hidden_layers * config.block_size * kv_heads * model_config.head_dim * element_size


@dataclass(slots=True)
class StartupReport:
    """What start-up measured and decided (kept on the engine as `LLMEngine.startup_report`)."""

    num_gpu_blocks: int                 # null block included (it is one of the blocks the budget bought)
    kv_cache_bytes: int                 # the budget the blocks were cut from
    bytes_per_block: int
    kv_cache_tokens: int                # int(max_concurrency x max_model_len), as vLLM logs it
    max_concurrency: float              # num_gpu_blocks / blocks per full-length request, as vLLM
    peak_activation_bytes: int          # measured by the profiling run (0 when it did not run)
    profile_seconds: float              # the profiling run's wall time
    policy: str                         # "kv_cache_memory_bytes" | "gpu_memory_utilization" | "cpu_default"


# ------------------------------------------------------------------------ the arithmetic (unit-tested)
def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """Whole KV blocks a budget of `budget_bytes` >= 0 buys; the null block 0 is one of them, not an extra.

    vLLM: `num_blocks = available_memory // bytes_per_block` in `get_kv_cache_config_from_groups`
    (vllm/v1/core/kv_cache_planning.py); `BlockPool` then takes block 0 from those as its null block.
    """
    if bytes_per_block <= 0:
        raise ValueError(f"bytes_per_block must be positive, got {bytes_per_block}")
    return max(0, budget_bytes) // bytes_per_block


def gpu_kv_budget_bytes(total_bytes: int, gpu_memory_utilization: float, weights_bytes: int,
                        peak_activation_bytes: int, non_torch_bytes: int) -> int:
    """vLLM's `requested_memory - non_kv_cache_memory` (may be negative: then nothing is left).

    The requested memory is rounded up, as vLLM's `request_memory` (vllm/v1/worker/utils.py)."""
    requested = math.ceil(total_bytes * gpu_memory_utilization)
    return requested - (weights_bytes + peak_activation_bytes + non_torch_bytes)


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """What start-up measured on the device, in bytes (vLLM: `MemorySnapshot` / `MemoryProfilingResult`)."""

    total_bytes: int                # the device's memory
    weights_bytes: int              # the loaded model
    peak_activation_bytes: int      # the profiling run's transient peak above what stays allocated
    non_torch_bytes: int            # outside torch's allocator (CUDA context, NCCL, ...)


def check_blocks_fit(num_blocks: int, block_size: int, max_model_len: int, budget_bytes: int, policy: str) -> None:
    """Refuse a pool whose usable blocks (the null block excluded) cannot hold one `max_model_len` request."""
    blocks_per_request = cdiv(max_model_len, block_size)
    if usable_blocks(num_blocks) < blocks_per_request:
        raise ValueError(
            f"the KV cache budget ({budget_bytes / 2**20:.1f} MiB, policy {policy}) holds {num_blocks} blocks of "
            f"{block_size} tokens, the null block among them, but one request of "
            f"max_model_len={max_model_len} tokens needs {blocks_per_request} usable blocks: raise "
            "kv_cache_memory_bytes or gpu_memory_utilization, or lower max_model_len")


def check_budget_positive(budget_bytes: int, policy: str) -> None:
    """vLLM: "No available memory for the cache blocks" when nothing is left for the KV cache."""
    if budget_bytes <= 0:
        raise ValueError(
            f"No available memory for the cache blocks (budget {budget_bytes / 2**20:.1f} MiB, policy {policy}): "
            "raise kv_cache_memory_bytes or gpu_memory_utilization")


def determine_num_gpu_blocks(profile: MemoryProfile, gpu_memory_utilization: float, bytes_per_block: int,
                             block_size: int, max_model_len: int) -> int:
    """KV blocks (the null block among them) for what a profiling run measured; ValueError when none fit.

    vLLM: `Worker.determine_available_memory` (vllm/v1/worker/gpu_worker.py) for the budget, then
    `get_kv_cache_config_from_groups` and `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_planning.py).
    """
    budget = gpu_kv_budget_bytes(profile.total_bytes, gpu_memory_utilization, profile.weights_bytes,
                                 profile.peak_activation_bytes, profile.non_torch_bytes)
    check_budget_positive(budget, "gpu_memory_utilization")
    num_blocks = num_blocks_for_budget(budget, bytes_per_block)
    check_blocks_fit(num_blocks, block_size, max_model_len, budget, "gpu_memory_utilization")
    return num_blocks


def cpu_kv_budget_bytes(available_ram_bytes: int | None, peak_activation_bytes: int,
                        default_bytes: int = DEFAULT_KV_CACHE_BYTES,
                        fraction: float = CPU_AVAILABLE_RAM_FRACTION) -> int:
    """min(default, fraction x available RAM - peak activations); the default when RAM is unknown."""
    if available_ram_bytes is None:
        return default_bytes
    return min(default_bytes, int(available_ram_bytes * fraction) - peak_activation_bytes)


def max_concurrency(num_gpu_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many requests of `max_model_len` tokens fit at once, as vLLM logs it ('Maximum concurrency'):
    all `num_gpu_blocks` (the null block counted, as vLLM's `get_max_concurrency_for_kv_cache_config`)
    over the blocks one full-length request needs."""
    return num_gpu_blocks / cdiv(max_model_len, block_size)


def kv_cache_tokens(num_gpu_blocks: int, block_size: int, max_model_len: int) -> int:
    """vLLM's logged 'KV cache size: N tokens' (`get_kv_cache_capacity`): max concurrency x max_model_len."""
    return int(max_concurrency(num_gpu_blocks, block_size, max_model_len) * max_model_len)


# ------------------------------------------------------------------------ measuring
def available_ram_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


@torch.inference_mode()
def profile_run(model: Any, config: EngineConfig) -> tuple[int, float]:
    """One forward at the largest batch the scheduler can build -> (peak activation bytes, seconds).

    `max_num_batched_tokens` prompt tokens split over min(max_num_seqs, tokens) sequences (vLLM's
    `_dummy_run`), a throw-away KV cache just big enough for them, logits for each sequence's last token.
    """
    num_tokens = min(config.max_num_batched_tokens, config.max_num_seqs * int(config.max_model_len))
    num_seqs = min(config.max_num_seqs, num_tokens)
    lengths = [num_tokens // num_seqs + (1 if i < num_tokens % num_seqs else 0) for i in range(num_seqs)]
    lengths = [min(length, int(config.max_model_len)) for length in lengths]
    block_size = config.block_size
    block_ids, next_block = [], 1
    for length in lengths:
        count = cdiv(length, block_size)
        block_ids.append(list(range(next_block, next_block + count)))
        next_block += count
    token_ids = [[1] * length for length in lengths]
    inputs = prepare_inputs(token_ids, [0] * num_seqs, lengths, block_ids, block_size).to(config.device)
    metadata = build_attention_metadata(inputs)
    param = next(model.parameters())
    shape = model.kv_cache_shape(next_block, block_size)
    kv_caches = [torch.zeros(shape, dtype=param.dtype, device=param.device)
                 for _ in range(model.config.num_hidden_layers)]
    kv_bytes = sum(cache.numel() * cache.element_size() for cache in kv_caches)
    on_cuda = param.device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(param.device)
        torch.cuda.reset_peak_memory_stats(param.device)
        before = torch.cuda.memory_allocated(param.device)
    else:
        before = _peak_rss_bytes()
    start = time.perf_counter()
    hidden = model(inputs.input_ids, inputs.positions, kv_caches, metadata)
    logits = model.compute_logits(hidden[inputs.logits_indices])
    torch.softmax(logits, dim=-1)   # the sampler's biggest temporary
    if on_cuda:
        torch.cuda.synchronize(param.device)
        peak = torch.cuda.max_memory_allocated(param.device) - before
    else:
        peak = max(0, _peak_rss_bytes() - before)
    seconds = time.perf_counter() - start
    del hidden, logits, kv_caches
    if on_cuda:
        torch.cuda.empty_cache()
    return max(0, peak - (kv_bytes if on_cuda else 0)), seconds


# ------------------------------------------------------------------------ the decision
def determine_num_kv_blocks(model: Any, config: EngineConfig, hf_config: Any, bytes_per_block: int) -> StartupReport:
    """Profile (when the budget depends on it), pick the budget by the policy above, log as vLLM."""
    max_model_len = int(config.max_model_len)
    blocks_per_request = cdiv(max_model_len, config.block_size)
    peak, seconds = 0, 0.0
    num_gpu_blocks = None
    on_cuda = str(config.device).startswith("cuda")
    if config.kv_cache_memory_bytes is not None:
        policy, budget = "kv_cache_memory_bytes", config.kv_cache_memory_bytes
        cap = None
    elif on_cuda:
        device = torch.device(config.device)
        torch.cuda.empty_cache()
        weights = torch.cuda.memory_allocated(device)
        peak, seconds = profile_run(model, config)
        free, total = torch.cuda.mem_get_info(device)
        non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
        policy = "gpu_memory_utilization"
        profile = MemoryProfile(total, weights, peak, non_torch)
        budget = gpu_kv_budget_bytes(total, config.gpu_memory_utilization, weights, peak, non_torch)  # reported
        # The blocks, checked, by the function the course's exercise mirrors (phase 13).
        num_gpu_blocks = determine_num_gpu_blocks(profile, config.gpu_memory_utilization, bytes_per_block,
                                                  config.block_size, max_model_len)
        cap = None
    else:
        peak, seconds = profile_run(model, config)
        policy, budget = "cpu_default", cpu_kv_budget_bytes(available_ram_bytes(), peak)
        cap = config.max_num_seqs * blocks_per_request
    if num_gpu_blocks is None:          # kv_cache_memory_bytes or CPU
        check_budget_positive(budget, policy)
        num_gpu_blocks = num_blocks_for_budget(budget, bytes_per_block)
        if cap is not None:             # mini's CPU cap: `cap` usable blocks, plus the null block
            num_gpu_blocks = min(num_gpu_blocks, cap + 1)
        check_blocks_fit(num_gpu_blocks, config.block_size, max_model_len, budget, policy)
    report = StartupReport(
        num_gpu_blocks=num_gpu_blocks, kv_cache_bytes=budget, bytes_per_block=bytes_per_block,
        kv_cache_tokens=kv_cache_tokens(num_gpu_blocks, config.block_size, max_model_len),
        max_concurrency=max_concurrency(num_gpu_blocks, config.block_size, max_model_len),
        peak_activation_bytes=peak, profile_seconds=seconds, policy=policy)
    if peak or seconds:
        logger.info("Memory profiling took %.2f seconds; peak activation memory %.2f MiB (%d tokens, %d seqs)",
                    seconds, peak / 2**20, min(config.max_num_batched_tokens, config.max_num_seqs * max_model_len),
                    config.max_num_seqs)
    logger.info("Available KV cache memory: %.2f MiB (policy %s); num_gpu_blocks: %d (the null block among them)",
                report.kv_cache_bytes / 2**20, policy, num_gpu_blocks)
    logger.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
                "GPU" if on_cuda else str(config.device).split(":")[0].upper(), f"{report.kv_cache_tokens:,}",
                f"{max_model_len:,}", report.max_concurrency)
    return report
