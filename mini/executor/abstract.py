"""What the engine core asks of whoever runs the model (mirrors vllm/v1/executor/abstract.py).

The engine core (mini/engine/core.py) never touches a model: it hands each step's `SchedulerOutput` (and the
structured-output bitmask) to its executor and gets a `ModelRunnerOutput` back. Behind that one call an
executor may run one worker in-process (`UniProcExecutor`, mini/executor/uniproc_executor.py) or one worker
process per tensor-parallel rank (`MultiprocExecutor`, mini/executor/multiproc_executor.py), which is why the
seam exists: the scheduler, the KV-block accounting and the output handling do not change with the number
of devices.

At construction an executor loads the model on every worker, fixes `max_model_len` from the checkpoint, sizes
the KV cache (the smallest count any worker can hold, as vLLM's `EngineCore._initialize_kv_caches`) and builds
the model runners. Afterwards it exposes `config` (resolved), `hf_config`, `num_gpu_blocks` and
`startup_report`.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from mini.config import EngineConfig
from mini.runner_outputs import ModelRunnerOutput


class Executor:
    """Base class: loads the model on its workers, sizes the KV cache, runs one step at a time."""

    # How many steps may be in flight at once (vLLM: `max_concurrent_batches`; 2 with async scheduling).
    max_concurrent_batches: int = 1

    def __init__(self, config: EngineConfig) -> None:
        self.config = config   # its `parts` (mini/roles.py) travel to the workers with it
        self.hf_config: Any = None
        self.num_gpu_blocks: int = 0
        self.startup_report: Any = None
        self.is_shutdown = False
        self._init_executor()

    def _init_executor(self) -> None:
        """Start the workers, load the model, size and allocate the KV cache; set the attributes above."""
        raise NotImplementedError

    def execute_model(self, scheduler_output: Any, grammar_output: Any = None,
                      trace: Any = None) -> ModelRunnerOutput:
        """Run one scheduled step on every worker; the sampled tokens come from rank 0."""
        raise NotImplementedError

    def execute_model_non_block(self, scheduler_output: Any, grammar_output: Any = None) -> Future[ModelRunnerOutput]:
        """Start one step and return its future at once (vLLM: `execute_model(..., non_block=True)`), for async
        scheduling (`EngineCore.step_with_batch_queue`, mini/engine/core.py). This default runs the step before
        returning (a done future); an executor that can overlap overrides it (`UniProcExecutor`: a worker thread)."""
        future: Future[ModelRunnerOutput] = Future()
        try:
            future.set_result(self.execute_model(scheduler_output, grammar_output))
        except Exception as error:  # noqa: BLE001 - handed to whoever takes the result, as vLLM's futures
            future.set_exception(error)
        return future

    def check_health(self) -> None:
        """Raise if a worker has died (vLLM: `Executor.check_health`)."""

    def shutdown(self) -> None:
        """Stop the workers and free what they hold. Idempotent."""
        self.is_shutdown = True
