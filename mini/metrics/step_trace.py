"""One engine step, as a step observer sees it (mini only: vLLM has no such hook).

vLLM's engine hands its stat loggers counters (`SchedulerStats`, `IterationStats`: vllm/v1/metrics/);
nothing else about a step leaves the engine core. mini's course draws more: what a step scheduled, the
flat batch the runner built, how the persistent batch's rows moved, and the block tables after it. An
engine with no observer builds none of it; one with observers builds a `StepTrace` per step and calls
each observer once, at the end of the one `EngineCore.step()` (mini/engine/core.py), as the step's outputs
leave the core:

    traces = []
    remove = llm.llm_engine.add_step_observer(lambda trace: traces.append((trace, trace.snapshot())))
    llm.generate(["Hello"], params)
    remove()

A step that schedules nothing (the engine only hands out the final outputs of aborted requests) has no
trace. The KV pool is copied only when an observer calls `snapshot()`, and only while it runs: the
snapshot is the state right after that step, and a trace kept for later answers it from that copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini.core.sched.output import SchedulerOutput
    from mini.metrics.stats import PoolSnapshot
    from mini.sample.logits_processor.interface import BatchUpdate
    from mini.worker.prepare_inputs import PreparedInputs


@dataclass(slots=True, eq=False)
class StepTrace:
    """What one `EngineCore.step()` did, for views, traces and tests."""

    step: int                                   # the scheduler's step count (1 for the first schedule())
    scheduler_output: SchedulerOutput           # what schedule() decided
    # The model runner's side (empty / None when the step ran no forward pass):
    req_ids: list[str] = field(default_factory=list)          # the batch rows, in order
    inputs: PreparedInputs | None = None        # the flat tensors of the forward pass
    batch_update: BatchUpdate | None = None     # what the persistent batch told the logits processors
    sampled_token_ids: list[list[int]] = field(default_factory=list)  # per row: the tokens it produced
    grammar_mask_seconds: float | None = None   # structured output: time to fill the bitmask (None: no row)
    outputs: list = field(default_factory=list)   # the EngineCoreOutputs (mini/engine/__init__.py) step() returns
    _take_snapshot: Callable[[], PoolSnapshot] | None = field(default=None, repr=False)
    _snapshot: PoolSnapshot | None = field(default=None, repr=False)

    def snapshot(self) -> PoolSnapshot:
        """The scheduler's queues and the KV pool right after the step (copied on the first call)."""
        if self._snapshot is None:
            if self._take_snapshot is None:
                raise RuntimeError("a step's pool snapshot can be taken only while its observers run: "
                                   "call trace.snapshot() inside the observer")
            self._snapshot = self._take_snapshot()
        return self._snapshot

    def record_batch_update(self, batch_update: BatchUpdate | None) -> None:
        """Called by the persistent batch when it hands this step's update to the logits processors."""
        self.batch_update = batch_update

    def close(self) -> None:
        """The observers have run: the engine moves on, so no later snapshot can be taken."""
        self._take_snapshot = None


StepObserver = Callable[[StepTrace], None]
