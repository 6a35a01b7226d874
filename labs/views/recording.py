"""Mirrors no single vllm/v1 file: it records a real mini engine run, step by step, as plain data.

It reads the state that vllm/v1/core/block_pool.py (ref counts,
free-block queue), vllm/v1/core/kv_cache_manager.py (block tables) and vllm/v1/core/sched/scheduler.py
(running/waiting, preemptions) keep, after every `LLMEngine.step()`.

    recording = record_run(llm, ["Hello", "The cat"], SamplingParams(temperature=0.0, max_tokens=6))
    recording.snapshots[3].block_tables   # {"r0": [1, 2], "r1": [3]}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class BatchInputs:
    """The flat tensors of one step, as lists (see mini/worker/prepare_inputs.py)."""

    req_ids: list[str]
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]


@dataclass(slots=True)
class KVSnapshot:
    """The KV-cache state after one engine step (step 0: before the first step)."""

    step: int
    block_size: int
    num_blocks: int
    ref_cnts: list[int]  # indexed by block id
    free_queue: list[int]  # block ids, head (next handed out) -> tail
    block_tables: dict[str, list[int]]  # request id -> its block ids, in order
    num_computed_tokens: dict[str, int]
    running: list[str]
    waiting: list[str]
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # what this step computed
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # human-readable: allocations, frees, preemptions
    batch: BatchInputs | None = None

    def owners(self) -> dict[int, list[str]]:
        """Block id -> the requests whose block table holds it."""
        result: dict[int, list[str]] = {}
        for req_id, block_ids in self.block_tables.items():
            for block_id in block_ids:
                result.setdefault(block_id, []).append(req_id)
        return result


@dataclass(slots=True)
class EngineRecording:
    snapshots: list[KVSnapshot]
    request_ids: list[str]  # in the order they were added (fixes each request's colour)
    output_token_ids: dict[str, list[int]] = field(default_factory=dict)  # each finished request's tokens

    def __len__(self) -> int:
        return len(self.snapshots)


def _tensor_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def batch_from_runner(engine: Any, scheduled_req_ids: Sequence[str]) -> BatchInputs | None:
    """The runner's last step inputs (`model_runner.last_inputs`), if it keeps them."""
    inputs = getattr(getattr(engine, "model_runner", None), "last_inputs", None)
    if inputs is None:
        return None
    input_batch = getattr(engine.model_runner, "input_batch", None)
    if input_batch is not None and hasattr(input_batch, "occupied_requests"):
        req_ids = [state.req_id for state in input_batch.occupied_requests()]  # the rows, in order
    else:
        req_ids = list(scheduled_req_ids)
    return BatchInputs(
        req_ids=req_ids[: len(_tensor_list(inputs["seq_lens"]))],
        **{
            name: _tensor_list(inputs[name])
            for name in (
                "input_ids",
                "positions",
                "slot_mapping",
                "query_start_loc",
                "seq_lens",
                "block_table",
            )
        },
    )


def snapshot_engine(engine: Any, step: int, scheduler_output: Any = None) -> KVSnapshot:
    """Read the scheduler, KV cache manager and block pool of `engine` (an LLMEngine) now."""
    scheduler = engine.scheduler
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    live = [r for r in scheduler.requests.values() if not r.is_finished()]
    block_tables = {r.request_id: manager.get_block_ids(r.request_id) for r in live}
    scheduled = dict(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
    return KVSnapshot(
        step=step,
        block_size=manager.block_size,
        num_blocks=pool.num_gpu_blocks,
        ref_cnts=[block.ref_cnt for block in pool.blocks],
        free_queue=[block.block_id for block in pool.free_block_queue.get_all_free_blocks()],
        block_tables={req_id: ids for req_id, ids in block_tables.items() if ids},
        num_computed_tokens={r.request_id: r.num_computed_tokens for r in live},
        running=[r.request_id for r in scheduler.running],
        waiting=[r.request_id for r in scheduler.waiting],
        num_scheduled_tokens=scheduled,
        preempted=sorted(getattr(scheduler_output, "preempted_req_ids", set()) or set()),
        batch=batch_from_runner(engine, list(scheduled)) if scheduler_output is not None else None,
    )


def describe_changes(before: KVSnapshot, after: KVSnapshot) -> list[str]:
    """Allocations, frees and preemptions between two snapshots, in words."""
    events = [f"preempt {req_id}: its blocks go back to the free queue" for req_id in after.preempted]
    for req_id in sorted(set(before.block_tables) | set(after.block_tables)):
        old, new = before.block_tables.get(req_id, []), after.block_tables.get(req_id, [])
        added = [b for b in new if b not in old]
        removed = [b for b in old if b not in new]
        if added:
            events.append(f"allocate {req_id}: +{added}")
        if removed:
            events.append(f"free {req_id}: {removed} (ref_cnt -> 0 joins the free-queue tail)")
    return events


def record_run(
    llm: Any,
    prompts: Sequence[Any],
    params: Any,
    max_steps: int = 1000,
    on_step: Callable[[Any, KVSnapshot], None] | None = None,
) -> EngineRecording:
    """Add `prompts` as requests r0, r1, ... and step the engine to the end, snapshotting each step.

    `on_step(engine, snapshot)` is called right after each snapshot (tests compare it with the engine).
    """
    engine = llm.llm_engine
    scheduler = engine.scheduler
    request_ids = [f"r{index}" for index in range(len(prompts))]
    for req_id, prompt in zip(request_ids, prompts):
        engine.add_request(req_id, prompt, params)
    captured: list[Any] = []
    original_schedule = scheduler.schedule
    had_own_schedule = "schedule" in vars(scheduler)

    def schedule_and_capture() -> Any:
        output = original_schedule()
        captured.append(output)
        return output

    output_token_ids: dict[str, list[int]] = {}
    snapshots = [snapshot_engine(engine, 0)]
    if on_step is not None:
        on_step(engine, snapshots[0])
    scheduler.schedule = schedule_and_capture
    try:
        for step in range(1, max_steps + 1):
            if not engine.has_unfinished_requests():
                break
            captured.clear()
            outputs = engine.step()
            snapshot = snapshot_engine(engine, step, captured[-1] if captured else None)
            snapshot.finished = [out.request_id for out in outputs if out.finished]
            output_token_ids.update(
                {out.request_id: list(out.outputs[0].token_ids) for out in outputs if out.finished}
            )
            snapshot.events = describe_changes(snapshots[-1], snapshot)
            snapshot.events += [f"finish {req_id}" for req_id in snapshot.finished]
            snapshots.append(snapshot)
            if on_step is not None:
                on_step(engine, snapshot)
    finally:
        if had_own_schedule:
            scheduler.schedule = original_schedule
        else:
            del scheduler.schedule  # drop the instance attribute: the class method is back
    return EngineRecording(snapshots=snapshots, request_ids=request_ids, output_token_ids=output_token_ids)
