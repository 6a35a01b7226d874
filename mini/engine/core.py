"""The engine core: the scheduler, the executor and the structured-output manager, stepped together.

Mirrors vllm/v1/engine/core.py (`EngineCore`: `add_request`, `abort_requests`, `step`). It knows token ids
only: the front end (mini/engine/llm_engine.py, mini/engine/async_llm.py) tokenizes prompts into
`EngineCoreRequest`s and detokenizes the `EngineCoreOutput`s this returns. That line is where vLLM cuts the
engine in two processes (the core's busy loop runs in `EngineCoreProc`, reached through an
`EngineCoreClient`): everything that crosses it is plain data.

One `step` is vLLM's `EngineCore.step`:

    Scheduler.schedule                  which requests run, how many tokens each   (vllm/v1/core/sched/scheduler.py)
    StructuredOutputManager.grammar_bitmask   the constrained rows' allowed tokens (vllm/v1/structured_output/)
    Executor.execute_model              one forward pass + sampling on the workers (vllm/v1/executor/)
    Scheduler.update_from_output        append tokens, stop checks, free blocks -> EngineCoreOutputs

vLLM starts the forward with `execute_model(..., non_block=True)` and computes the bitmask while it runs, then
calls `sample_tokens(grammar_output)`; mini computes the bitmask first and hands both to one `execute_model`.

With `async_scheduling=True`, `step` is vLLM's `step_with_batch_queue` instead: step N+1 is scheduled, with
placeholders for step N's tokens (mini/core/sched/async_scheduler.py), while step N runs. The core keeps a queue
of at most `batch_queue_size` (2) steps handed to the executor without waiting
(`Executor.execute_model_non_block`; the `UniProcExecutor` runs them in order on one worker thread,
mini/executor/uniproc_executor.py). One call:

  1. if a request can be scheduled, schedule a step, compute its grammar bitmask, hand it over; if the queue
     still has room and the step computes something, return at once with no outputs;
  2. otherwise wait for the OLDEST step and run `update_from_output` on it -> its outputs.

So while the worker thread computes step N, this thread schedules step N+1, and then (back in the front end)
detokenizes step N's outputs: the host work of one step hides behind the forward of the next (torch releases
the GIL inside its kernels). Exceptions raised by a step surface when its result is taken. A grammar's bitmask
for step N+1 needs the token step N samples: vLLM defers only the sampling of such a step
(`pending_structured_output_tokens`); mini's `execute_model` takes the bitmask with the forward, so mini waits
for step N before it hands step N+1 over (exact, no overlap on those steps). When the scheduler has nothing
left but a step is still in flight, the step is waited for and its outputs dropped (`update_from_output` skips
finished requests), so an idle engine has nothing running.

Step observers (mini only, for the course's views and traces: vLLM hands its stat loggers counters only) are
fed here, by the one `step`: with an observer attached, a step runs alone (after any steps in flight), builds a
`StepTrace` (mini/metrics/step_trace.py) and calls each observer once at its end. Without one, nothing is
traced and nothing is copied.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from mini import roles
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched.async_scheduler import async_scheduler_class
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.scheduler import Scheduler
from mini.engine import EngineCoreOutput, EngineCoreRequest
from mini.executor import executor_class
from mini.metrics.stats import PoolSnapshot
from mini.metrics.step_trace import StepObserver, StepTrace
from mini.runner_outputs import ModelRunnerOutput
from mini.structured_output import GrammarOutput, StructuredOutputManager
from mini.tokenizer import load_tokenizer


def eos_token_id_of(tokenizer: Any, hf_config: Any) -> int | None:
    """The end-of-sequence id: the tokenizer's, else the checkpoint config's (its first, if a list)."""
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return None if eos is None else int(eos)


class EngineCore:
    """Scheduler + executor + structured output: takes `EngineCoreRequest`s, returns `EngineCoreOutput`s."""

    def __init__(self, config: EngineConfig, parts: dict[str, Any] | None = None) -> None:
        # Which implementation each role runs (mini/roles.py), carried by the config (`config.parts`): `parts`
        # on top of any `mini.roles.use(...)` block a core built directly is built in (LLMEngine did it already).
        config = roles.with_pending(config, parts)
        torch.manual_seed(config.seed)
        self.model_executor = executor_class(config)(config)
        self.config = config = self.model_executor.config        # max_model_len resolved
        self.hf_config = self.model_executor.hf_config
        self.num_gpu_blocks = self.model_executor.num_gpu_blocks
        self.startup_report = self.model_executor.startup_report  # None with num_gpu_blocks_override
        self.vocab_size = int(self.hf_config.vocab_size)
        # vLLM's engine core loads the tokenizer for the structured-output backends only.
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(config.model_dir)
        self.eos_token_id = eos_token_id_of(self.tokenizer, self.hf_config)

        self.kv_cache_manager = roles.resolve(config, KVCacheManager)(
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            hash_algo=config.prefix_caching_hash_algo,
            config=config,
        )
        scheduler_class = roles.resolve(config, Scheduler)
        if config.async_scheduling:   # placeholders for the tokens of the step in flight
            scheduler_class = async_scheduler_class(scheduler_class)
        self.scheduler = scheduler_class(config, self.kv_cache_manager)
        # Async scheduling: the steps handed to the executor and not finished yet, newest first (vLLM: the
        # batch queue, `max_concurrent_batches` long); None when every step runs to its end (`step_with_batch_queue`).
        self.batch_queue_size = max(self.model_executor.max_concurrent_batches, 2 if config.async_scheduling else 1)
        self.batch_queue: deque | None = deque() if self.batch_queue_size > 1 else None
        # Structured output: compiles grammars on a worker thread, builds per-step bitmasks.
        self.structured_output_manager = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                                 self.eos_token_id, config=config)
        # Called once at the end of every step that scheduled (views, traces, tests); none by default.
        self.step_observers: list[StepObserver] = []

    # ------------------------------------------------------------------ what the front end needs to know
    def startup_info(self) -> dict[str, Any]:
        """The numbers the front end checks requests against (vLLM sends them in its start-up handshake)."""
        return {
            "max_model_len": int(self.config.max_model_len),
            "max_request_len": int(self.scheduler.max_request_len),
            "num_usable_tokens": int(self.kv_cache_manager.num_usable_tokens),
            "num_gpu_blocks": int(self.num_gpu_blocks),
            "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
        }

    # ------------------------------------------------------------------ requests in, outputs out
    def add_request(self, request: EngineCoreRequest | Request) -> None:
        """Queue one request (an `EngineCoreRequest` from the front end, or a `Request` made from one)."""
        if isinstance(request, EngineCoreRequest):
            request = Request.from_engine_core_request(request)
        self.scheduler.add_request(request)
        self.structured_output_manager.grammar_init(request)  # structured output: compile off the step loop

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish these requests now (unknown ids are ignored); their KV blocks are freed at once."""
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """Finish requests the front end ended (a stop string found by the detokenizer)."""
        self.scheduler.finish_requests(list(request_ids), status)

    def has_unfinished_requests(self) -> bool:
        """Requests not finished, or (async scheduling) a step still in flight."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        """Schedule, run the model once, update -> the outputs of the requests that progressed.

        With async scheduling, `step_with_batch_queue` instead: it may return [] after only starting a step, and
        returns the outputs of the step before it on the next call. With step observers, a traced step."""
        if self.step_observers:
            return self._step_traced()
        if self.batch_queue is not None:
            return self.step_with_batch_queue()
        if not self.scheduler.has_unfinished_requests():
            return []
        return self.execute_scheduled(self.scheduler.schedule())[1]

    def execute_scheduled(self, scheduler_output: SchedulerOutput, trace: StepTrace | None = None
                          ) -> tuple[ModelRunnerOutput, list[EngineCoreOutput]]:
        """The rest of `step` after `schedule()`: the grammar bitmask, the model, the scheduler's update ->
        (the runner's output, the engine-core outputs of the requests that progressed)."""
        grammar_output = self._grammar_output(scheduler_output, trace)
        runner_output = self.model_executor.execute_model(scheduler_output, grammar_output, trace=trace)
        if scheduler_output.total_num_scheduled_tokens == 0:  # structured output: only grammars left to wait for
            self.structured_output_manager.wait_for_compilation(timeout=0.01)
        return runner_output, self.scheduler.update_from_output(scheduler_output, runner_output)

    # ------------------------------------------------------------------ async scheduling: the batch queue
    def step_with_batch_queue(self) -> list[EngineCoreOutput]:
        """One call of the async engine core's loop (module docstring): [] while it only filled the queue."""
        queue, scheduler = self.batch_queue, self.scheduler
        assert queue is not None, "step_with_batch_queue needs async scheduling (EngineCore.batch_queue)"
        if scheduler.has_unfinished_requests():
            scheduler_output = scheduler.schedule()
            executed = scheduler_output.total_num_scheduled_tokens > 0
            if executed and scheduler.has_pending_structured_output_tokens(scheduler_output):
                outputs = self._finish_oldest_step() if queue else []   # the grammars must see the tokens in flight
                self._submit(scheduler_output)
                return outputs
            self._submit(scheduler_output)
            if not executed:   # structured output: only grammars still compiling; do not spin
                self.structured_output_manager.wait_for_compilation(timeout=0.01)
            elif len(queue) < self.batch_queue_size:
                return []
        elif not queue:
            return []
        outputs = self._finish_oldest_step()
        if not scheduler.has_unfinished_requests():
            outputs += self.drain_batch_queue()
        return outputs

    def _submit(self, scheduler_output: SchedulerOutput) -> None:
        grammar_output = self.structured_output_manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        future = self.model_executor.execute_model_non_block(scheduler_output, grammar_output)
        self.batch_queue.appendleft((future, scheduler_output))

    def _finish_oldest_step(self) -> list[EngineCoreOutput]:
        """Wait for the oldest step in the queue and hand its tokens to the scheduler -> its outputs."""
        future, scheduler_output = self.batch_queue.pop()
        return self.scheduler.update_from_output(scheduler_output, future.result())

    def drain_batch_queue(self) -> list[EngineCoreOutput]:
        """Finish every step in flight, oldest first -> their outputs (nothing to do without async scheduling)."""
        outputs: list[EngineCoreOutput] = []
        while self.batch_queue:
            outputs += self._finish_oldest_step()
        return outputs

    # ------------------------------------------------------------------ step observers (mini only)
    def add_step_observer(self, observer: StepObserver) -> Callable[[], None]:
        """Call `observer(trace)` at the end of every step that schedules; returns a function removing it."""
        if not callable(observer):
            raise TypeError(f"a step observer must be callable, got {type(observer).__name__}")
        self.step_observers.append(observer)
        return lambda: self.remove_step_observer(observer)

    def remove_step_observer(self, observer: StepObserver) -> None:
        """Stop calling `observer` (nothing happens if it is not attached)."""
        if observer in self.step_observers:
            self.step_observers.remove(observer)

    def snapshot_pool(self) -> PoolSnapshot:
        """A copy of the scheduler's queues and the KV pool now (block tables, free queue, ref counts)."""
        return PoolSnapshot.from_scheduler(self.scheduler)

    def _step_traced(self) -> list[EngineCoreOutput]:
        """A step that runs alone, after the steps in flight, and hands its `StepTrace` to the observers."""
        outputs = self.drain_batch_queue()
        if not self.scheduler.has_unfinished_requests():
            return outputs
        scheduler_output = self.scheduler.schedule()
        trace = StepTrace(step=self.scheduler.step_index, scheduler_output=scheduler_output,
                          _take_snapshot=self.snapshot_pool)
        runner_output, core_outputs = self.execute_scheduled(scheduler_output, trace)
        outputs += core_outputs
        trace.req_ids = list(runner_output.req_ids)
        trace.sampled_token_ids = runner_output.sampled_token_ids
        trace.outputs = list(outputs)
        try:
            for observer in list(self.step_observers):
                observer(trace)
        finally:
            trace.close()
        return outputs

    def _grammar_output(self, scheduler_output: SchedulerOutput, trace: StepTrace | None) -> GrammarOutput | None:
        manager = self.structured_output_manager
        if trace is None:
            return manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        started = time.perf_counter()
        grammar_output = manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        if grammar_output is not None:
            trace.grammar_mask_seconds = time.perf_counter() - started
        return grammar_output

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block; refused (False) while a request holds blocks."""
        return self.scheduler.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the executor's workers and the grammar compiler. Idempotent."""
        self.model_executor.shutdown()
        shutdown = getattr(self.structured_output_manager, "shutdown", None)
        if shutdown is not None:
            shutdown()
