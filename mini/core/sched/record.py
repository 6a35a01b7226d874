"""Snapshots of the scheduler for widgets (no vLLM counterpart; vLLM's nearest is
vllm/v1/core/sched/scheduler.py's SchedulerStats and KV events)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mini.core.sched.output import SchedulerOutput, StepRecord

if TYPE_CHECKING:
    from mini.core.sched.scheduler import Scheduler


def make_step_record(scheduler: Scheduler, output: SchedulerOutput) -> StepRecord:
    """What one schedule() decided, plus the block tables and free queue right after it."""
    manager = scheduler.kv_cache_manager
    return StepRecord(
        step=output.step,
        num_scheduled_tokens=dict(output.num_scheduled_tokens),
        partial_prefill_req_ids=set(output.partial_prefill_req_ids),
        preempted_req_ids=set(output.preempted_req_ids),
        finished_req_ids=set(output.finished_req_ids),
        block_ids={r.request_id: manager.get_block_ids(r.request_id) for r in scheduler.running},
        num_computed_tokens={r.request_id: r.num_computed_tokens for r in scheduler.running},
        free_block_ids=[b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()],
        waiting_req_ids=[r.request_id for r in scheduler.waiting],
    )
