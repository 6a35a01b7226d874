"""The engine core's step with async scheduling: schedule step N+1 while step N runs.

Mirrors `EngineCore.step_with_batch_queue` in vllm/v1/engine/core.py. The core keeps a queue of at most
`batch_queue_size` (2) steps handed to the executor without waiting (`Executor.execute_model_non_block`; the
`UniProcExecutor` runs them in order on one worker thread, mini/executor/uniproc_executor.py). One call:

  1. if a request can be scheduled, schedule a step (the `AsyncScheduler` puts placeholders for the tokens of
     the step in flight, mini/core/sched/async_scheduler.py), compute its grammar bitmask, hand it over; if the
     queue still has room and the step computes something, return at once with no outputs;
  2. otherwise wait for the OLDEST step and run `update_from_output` on it -> its outputs.

So while the worker thread computes step N, this thread schedules step N+1, and then (back in the front end)
detokenizes step N's outputs: the host work of one step hides behind the forward of the next (torch releases
the GIL inside its kernels). Exceptions raised by a step surface when its result is taken.

Structured output: a grammar's bitmask for step N+1 needs the token step N samples. vLLM defers only the
sampling of such a step (`pending_structured_output_tokens`: `execute_model` first, `sample_tokens` once the
previous output is in); mini's `execute_model` takes the bitmask with the forward, so mini waits for step N
before it hands step N+1 over: exact, with no overlap on those steps.

When the scheduler has nothing left but a step is still in flight (its requests stopped or were aborted after
it was scheduled), the step is waited for and its outputs dropped (`update_from_output` skips finished
requests), so an idle engine has nothing running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mini.engine import EngineCoreOutput

if TYPE_CHECKING:
    from mini.core.sched.output import SchedulerOutput
    from mini.engine.core import EngineCore


def step_with_batch_queue(core: EngineCore) -> list[EngineCoreOutput]:
    """One call of the async engine core's loop (module docstring): [] while it only filled the queue."""
    queue = core.batch_queue
    assert queue is not None, "step_with_batch_queue needs async scheduling (EngineCore.batch_queue)"
    scheduler = core.scheduler
    if scheduler.has_unfinished_requests():
        scheduler_output = scheduler.schedule()
        executed = scheduler_output.total_num_scheduled_tokens > 0
        if executed and scheduler.has_pending_structured_output_tokens(scheduler_output):
            outputs = finish_oldest_step(core) if queue else []   # the grammars must see the tokens in flight
            _submit(core, scheduler_output)
            return outputs
        _submit(core, scheduler_output)
        if not executed:   # structured output: only grammars still compiling; do not spin
            core.structured_output_manager.wait_for_compilation(timeout=0.01)
        elif len(queue) < core.batch_queue_size:
            return []
    elif not queue:
        return []
    outputs = finish_oldest_step(core)
    if not scheduler.has_unfinished_requests():
        outputs += drain_batch_queue(core)
    return outputs


def finish_oldest_step(core: EngineCore) -> list[EngineCoreOutput]:
    """Wait for the oldest step in the queue and hand its tokens to the scheduler -> its outputs."""
    future, scheduler_output = core.batch_queue.pop()
    return core.scheduler.update_from_output(scheduler_output, future.result())


def drain_batch_queue(core: EngineCore) -> list[EngineCoreOutput]:
    """Finish every step in flight, oldest first -> their outputs (the engine is then synchronous again)."""
    outputs: list[EngineCoreOutput] = []
    while core.batch_queue:
        outputs += finish_oldest_step(core)
    return outputs


def _submit(core: EngineCore, scheduler_output: SchedulerOutput) -> None:
    grammar_output = core.structured_output_manager.grammar_bitmask(core.scheduler.requests, scheduler_output)
    future = core.model_executor.execute_model_non_block(scheduler_output, grammar_output)
    core.batch_queue.appendleft((future, scheduler_output))
