"""One worker in the engine core's own process (mirrors vllm/v1/executor/uniproc_executor.py).

The default executor: no tensor parallelism, so no other process and no collective. The engine core calls the
worker directly; `driver_worker`, `model_runner` and `model` are there for the course's views and the tests
that look inside (in-process engines only).

With async scheduling, `execute_model_non_block` runs the steps in order on one worker thread (vLLM's
`UniProcExecutor` returns a future from its `AsyncModelRunnerOutput` instead: the GPU runs the step while
the host goes on); torch releases the GIL inside its kernels, so the engine core schedules meanwhile.
Each thread gives its OpenMP pool back when it stops running forwards (mini/system_utils.py): the engine
core's thread when the worker thread takes a run of steps over, the worker thread when it has no step left.
Otherwise the two pools (or another engine's, on the same process) outnumber the cores and libgomp throttles
every parallel region: an in-process async engine took 11.6 ms a step instead of 7.1 on 2 cores.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mini.executor.abstract import Executor
from mini.runner_outputs import ModelRunnerOutput
from mini.system_utils import release_libgomp_threads
from mini.worker.worker import Worker


class UniProcExecutor(Executor):
    """Runs the model with one `Worker` in this process."""

    def _init_executor(self) -> None:
        worker = Worker(self.config, rank=0)
        worker.load_model()
        self.config = worker.config                   # max_model_len resolved from the checkpoint
        self.hf_config = worker.hf_config
        self.num_gpu_blocks = worker.determine_num_blocks()
        self.startup_report = worker.startup_report
        worker.initialize_cache(self.num_gpu_blocks)
        self.driver_worker = worker
        # Async scheduling: steps run in order on one worker thread while the engine core schedules the next
        # (vLLM: 2 concurrent batches, `VllmConfig.max_concurrent_batches`).
        # The thread starts with the first such step and stops at `shutdown`.
        self.step_thread: ThreadPoolExecutor | None = None
        self._steps_in_flight = 0                     # submitted and not finished; the lock guards it
        self._steps_lock = threading.Lock()
        if getattr(self.config, "async_scheduling", False):
            self.max_concurrent_batches = 2

    @property
    def model_runner(self) -> Any:
        return self.driver_worker.model_runner

    @property
    def model(self) -> Any:
        return self.driver_worker.model

    def execute_model(self, scheduler_output: Any, grammar_output: Any = None,
                      trace: Any = None) -> ModelRunnerOutput:
        return self.driver_worker.execute_model(scheduler_output, grammar_output, trace=trace)

    def execute_model_non_block(self, scheduler_output: Any, grammar_output: Any = None) -> Future[ModelRunnerOutput]:
        if self.max_concurrent_batches < 2:
            return super().execute_model_non_block(scheduler_output, grammar_output)
        with self._steps_lock:
            self._steps_in_flight += 1
            taking_over = self._steps_in_flight == 1
        if taking_over:          # the worker thread runs the forwards from now on: this thread's pool goes
            release_libgomp_threads()
        if self.step_thread is None:
            self.step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mini-step")
        return self.step_thread.submit(self._run_step, scheduler_output, grammar_output)

    def _run_step(self, scheduler_output: Any, grammar_output: Any) -> ModelRunnerOutput:
        """One step on the worker thread; the last of a run gives the thread's OpenMP pool back."""
        try:
            return self.driver_worker.execute_model(scheduler_output, grammar_output)
        finally:
            with self._steps_lock:
                self._steps_in_flight -= 1
                idle = self._steps_in_flight == 0
            if idle:
                release_libgomp_threads()

    def shutdown(self) -> None:
        if self.step_thread is not None:
            self.step_thread.shutdown(wait=True)   # the step in flight finishes first
            self.step_thread = None
        super().shutdown()
