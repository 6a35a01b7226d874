"""Which executor runs the model for a config (vLLM: `Executor.get_class` in vllm/v1/executor/abstract.py)."""

from __future__ import annotations

from mini.config import EngineConfig
from mini.executor.abstract import Executor


def executor_class(config: EngineConfig) -> type[Executor]:
    """One in-process worker without tensor parallelism; one worker process per rank with it."""
    if int(getattr(config, "tensor_parallel_size", 1) or 1) > 1:
        from mini.executor.multiproc_executor import MultiprocExecutor
        return MultiprocExecutor
    from mini.executor.uniproc_executor import UniProcExecutor
    return UniProcExecutor
