"""One device's share of the engine: its model (or its shard of the model), its KV cache, its model runner.

Mirrors vllm/v1/worker/gpu_worker.py (`Worker`: `load_model`, `determine_available_memory`,
`initialize_from_config`, `execute_model`). An executor (mini/executor/) owns one worker per device: the
`UniProcExecutor` one in the engine core's own process, the `MultiprocExecutor` one per tensor-parallel rank,
each in its own process. The worker's life has three steps, in this order, as vLLM's:

    load_model()              the weights (this rank's shard of them)
    determine_num_blocks()    profile a forward at the maximum batch, size the KV cache (mini/worker/startup.py)
    initialize_cache(n)       allocate n KV blocks per layer and build the model runner around them

With several workers the executor takes the smallest block count any of them can afford, so every rank holds
the same block table (vLLM does the same in `vllm/v1/engine/core.py` `_initialize_kv_caches`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mini import roles
from mini.config import EngineConfig
from mini.model.loader import load_model
from mini.runner_outputs import ModelRunnerOutput
from mini.worker.model_runner import ModelRunner
from mini.worker.startup import (
    StartupReport,
    determine_num_kv_blocks,
    kv_bytes_per_block,
    resolve_max_model_len,
)


class Worker:
    """The model, KV cache and model runner of one rank (rank 0 of 1 without tensor parallelism)."""

    def __init__(self, config: EngineConfig, rank: int = 0) -> None:
        self.config = config   # its `parts` (mini/roles.py) pick the model's, the backend's and the runner's classes
        self.rank = rank
        self.model: Any = None
        self.hf_config: Any = None
        self.model_runner: ModelRunner | None = None
        self.startup_report: StartupReport | None = None

    def load_model(self) -> None:
        """Load the weights and fix `max_model_len` from the checkpoint's config when it was not given."""
        self.model, self.hf_config = load_model(str(self.config.model_dir), self.config.device,
                                                self.config.torch_dtype, config=self.config,
                                                quantization=self.config.quantization)
        self.config = dataclasses.replace(self.config,
                                          max_model_len=resolve_max_model_len(self.config, self.hf_config))

    def determine_num_blocks(self) -> int:
        """Total KV blocks INCLUDING the null block 0 (vLLM's num_gpu_blocks counts it too).

        `num_gpu_blocks_override` wins; otherwise a profiling run measures the peak activation memory and the
        KV cache gets what remains of the budget (mini/worker/startup.py says which budget and why).
        """
        if self.config.num_gpu_blocks_override is not None:
            return int(self.config.num_gpu_blocks_override)
        self.startup_report = determine_num_kv_blocks(self.model, self.config, self.hf_config,
                                                      kv_bytes_per_block(self.config, self.hf_config,
                                                                         self.config.tensor_parallel_size))
        return self.startup_report.num_gpu_blocks

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache and build the model runner around it."""
        self.model_runner = roles.resolve(self.config, ModelRunner)(self.config, self.model, self.hf_config,
                                                                    num_blocks)

    def execute_model(self, scheduler_output: Any, grammar_output: Any = None,
                      trace: Any = None) -> ModelRunnerOutput:
        """One forward pass and the sampling of the scheduled requests (`ModelRunner.execute_model`)."""
        assert self.model_runner is not None, "initialize_cache() must run before execute_model()"
        return self.model_runner.execute_model(scheduler_output, grammar_output, trace=trace)
