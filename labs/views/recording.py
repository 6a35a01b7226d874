"""Mirrors no vllm/v1 file: it records a real mini engine run, step by step, as plain data.

It reads the engine's public surface only: a step observer (`engine.add_step_observer`, see
`traced_step`) gets each step's `StepTrace` (mini/metrics/step_trace.py): what the step scheduled and who
it preempted, the runner's flat batch and its rows, and `trace.snapshot()`, a `PoolSnapshot` of the block
tables, ref counts and free queue that vllm/v1/core/block_pool.py and kv_cache_manager.py keep, and of
the running / waiting queues. Before the first step, `engine.snapshot_pool()` gives the same snapshot.

    recording = record_run(llm, ["Hello", "The cat"], SamplingParams(temperature=0.0, max_tokens=6))
    recording.snapshots[3].block_tables   # {"r0": [1, 2], "r1": [3]}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mini.metrics.stats import PoolSnapshot
from mini.metrics.step_trace import StepTrace


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


_BATCH_FIELDS = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_table")


def traced_step(engine: Any, snapshot: bool = True) -> tuple[list[Any], StepTrace | None]:
    """`engine.step()` watched by a step observer for that one step: (its outputs, its `StepTrace`).

    The trace is None when the step scheduled nothing (it only handed out final outputs). `snapshot=True`
    takes the pool snapshot inside the observer (`trace.snapshot()` then answers from that copy).
    """
    traces: list[StepTrace] = []

    def observe(trace: StepTrace) -> None:
        if snapshot:
            trace.snapshot()
        traces.append(trace)

    remove_observer = engine.add_step_observer(observe)
    try:
        outputs = engine.step()
    finally:
        remove_observer()
    return outputs, (traces[0] if traces else None)


def batch_from_trace(trace: StepTrace) -> BatchInputs | None:
    """The flat batch of a traced step (`trace.inputs`), its rows named by `trace.req_ids`; None when the
    step ran no forward pass."""
    inputs = trace.inputs
    if inputs is None:
        return None
    fields = {name: _tensor_list(inputs[name]) for name in _BATCH_FIELDS}
    return BatchInputs(req_ids=list(trace.req_ids)[: len(fields["seq_lens"])], **fields)


def kv_snapshot(pool: PoolSnapshot, step: int, trace: StepTrace | None = None) -> KVSnapshot:
    """A `KVSnapshot` from a `PoolSnapshot`; `trace` (the step just run) adds what it computed, who it
    preempted and its flat batch; None (step 0) leaves them empty."""
    scheduler_output = None if trace is None else trace.scheduler_output
    return KVSnapshot(
        step=step,
        block_size=pool.block_size,
        num_blocks=pool.num_gpu_blocks,
        ref_cnts=list(pool.block_ref_cnts),
        free_queue=list(pool.free_block_ids),
        block_tables={req_id: list(ids) for req_id, ids in pool.block_ids.items() if ids},
        num_computed_tokens=dict(pool.num_computed_tokens),
        running=list(pool.running_req_ids),
        waiting=list(pool.waiting_req_ids),
        num_scheduled_tokens={} if scheduler_output is None else dict(scheduler_output.num_scheduled_tokens),
        preempted=[] if scheduler_output is None else sorted(scheduler_output.preempted_req_ids),
        batch=None if trace is None else batch_from_trace(trace),
    )


def snapshot_engine(engine: Any, step: int, trace: StepTrace | None = None) -> KVSnapshot:
    """The KV state of `engine` (an LLMEngine): right after the traced step `trace` (from its snapshot),
    or now (`engine.snapshot_pool()`) when `trace` is None."""
    return kv_snapshot(engine.snapshot_pool() if trace is None else trace.snapshot(), step, trace)


def _in_order(mapping: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """`mapping` with the ids of `order` first, in that order; any other id after them, as it was."""
    rank = {req_id: index for index, req_id in enumerate(order)}
    return dict(sorted(mapping.items(), key=lambda item: rank.get(item[0], len(rank))))


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
            events.append(f"free {req_id}: {removed} (ref_cnt -> 0: back to the free queue)")
    return events


def _order_by_arrival(snapshot: KVSnapshot, request_ids: Sequence[str]) -> None:
    """List the block tables in the order the requests were added (the stats list running, then waiting)."""
    snapshot.block_tables = _in_order(snapshot.block_tables, request_ids)
    snapshot.num_computed_tokens = _in_order(snapshot.num_computed_tokens, request_ids)


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
    request_ids = [f"r{index}" for index in range(len(prompts))]
    for req_id, prompt in zip(request_ids, prompts, strict=False):
        engine.add_request(req_id, prompt, params)
    output_token_ids: dict[str, list[int]] = {}
    snapshots = [snapshot_engine(engine, 0)]
    _order_by_arrival(snapshots[0], request_ids)
    if on_step is not None:
        on_step(engine, snapshots[0])
    for step in range(1, max_steps + 1):
        if not engine.has_unfinished_requests():
            break
        outputs, trace = traced_step(engine)   # trace None: the step scheduled nothing
        snapshot = snapshot_engine(engine, step, trace)
        _order_by_arrival(snapshot, request_ids)
        snapshot.finished = [out.request_id for out in outputs if out.finished]
        output_token_ids.update(
            {out.request_id: list(out.outputs[0].token_ids) for out in outputs if out.finished}
        )
        snapshot.events = describe_changes(snapshots[-1], snapshot)
        snapshot.events += [f"finish {req_id}" for req_id in snapshot.finished]
        snapshots.append(snapshot)
        if on_step is not None:
            on_step(engine, snapshot)
    return EngineRecording(snapshots=snapshots, request_ids=request_ids, output_token_ids=output_token_ids)
