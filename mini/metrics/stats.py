"""Mirrors vllm/v1/metrics/stats.py: a snapshot of the scheduler after a step.

vLLM's `Scheduler.make_stats()` returns a `SchedulerStats` (running / waiting counts, KV-cache usage,
prefix-cache counters) that the engine hands to its stat loggers. mini's has the same counts plus the
state a teaching view draws: every request's block table and progress, the free-block queue in order
and each block's reference count. Views and tests read this, not the scheduler's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SchedulerStats:
    """The scheduler and its KV pool right after `schedule()` (or between steps)."""

    step: int                                   # schedule() calls so far
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float                       # fraction of usable blocks in use (0.0 - 1.0)
    num_preemptions: int                        # preemptions since the engine started
    running_req_ids: list[str] = field(default_factory=list)   # in scheduling order
    waiting_req_ids: list[str] = field(default_factory=list)   # queue order (preempted ones at the front)
    block_ids: dict[str, list[int]] = field(default_factory=dict)        # each unfinished request's blocks
    num_computed_tokens: dict[str, int] = field(default_factory=dict)    # each unfinished request's progress
    free_block_ids: list[int] = field(default_factory=list)    # free queue, head (evicted first) to tail
    block_ref_cnts: list[int] = field(default_factory=list)    # ref count of block 0, 1, ... (0 = free)
    num_gpu_blocks: int = 0                     # the null block included
    block_size: int = 0
