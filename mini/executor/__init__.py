"""Executors: who runs the model for the engine core (mirrors vllm/v1/executor/).

`executor_class(config)` (select.py) picks one: `UniProcExecutor` (one worker in the engine core's process) without
tensor parallelism, `MultiprocExecutor` (one worker process per rank) with it.
"""

from mini.executor.abstract import Executor
from mini.executor.select import executor_class

__all__ = ["Executor", "executor_class"]
