"""The engine loop: add_request -> step -> outputs, with abort.

Mirrors vllm/v1/engine/llm_engine.py (LLMEngine) and vllm/v1/engine/core.py (EngineCore.step).
vLLM runs the engine core (scheduler + model executor) in a separate process and talks to it over
ZMQ. Its `EngineCore.step` schedules, starts the forward with `execute_model(..., non_block=True)`,
computes the structured-output grammar bitmask while the forward runs, then calls
`sample_tokens(grammar_output)` (the model runner applies the mask, then samples) and
`update_from_output`; `LLMEngine.step` then runs the output processor and aborts the requests a stop
string finished. mini's choice: one process and no overlap; `step` calls the same pieces in order, with
the forward, the mask and the sampling in one `execute_model` call:

    InputProcessor.process      text -> token ids, validation            (vllm/v1/engine/input_processor.py)
    Scheduler.schedule          which requests run, how many tokens each  (vllm/v1/core/sched/scheduler.py)
    ModelRunner.execute_model   one forward pass + sampling               (vllm/v1/worker/gpu_model_runner.py)
    Scheduler.update_from_output append tokens, stop checks, free blocks
    OutputProcessor             detokenize, stop strings, RequestOutput   (vllm/v1/engine/output_processor.py)
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.scheduler import Scheduler
from mini.engine.input_processor import InputProcessor
from mini.engine.output_processor import OutputProcessor
from mini.engine.parallel_sampling import ParentRequest
from mini.model.llama import DecoderConfig
from mini.model.loader import load_model
from mini.outputs import RequestOutput
from mini.sampling_params import SamplingParams
from mini.seams import seam
from mini.structured_output import StructuredOutputManager
from mini.tokenizer import load_tokenizer
from mini.worker.model_runner import ModelRunner


class LLMEngine:
    """Owns the scheduler, the KV cache manager, the model runner and the I/O processors."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        model_dir = config.model_dir
        self.model, self.hf_config = load_model(str(model_dir), config.device, config.torch_dtype)
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(model_dir)

        max_model_len = self._resolve_max_model_len(config, self.hf_config)
        self.config = config = dataclasses.replace(config, max_model_len=max_model_len)
        self.vocab_size = int(self.hf_config.vocab_size)
        self.num_gpu_blocks = self._resolve_num_blocks(config, self.hf_config)

        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            hash_algo=config.prefix_caching_hash_algo,
        )
        self.scheduler = Scheduler(config, self.kv_cache_manager)
        self.model_runner = ModelRunner(config, self.model, self.hf_config, self.num_gpu_blocks)
        self.input_processor = InputProcessor(
            self.tokenizer, self.vocab_size, max_model_len, self._eos_token_id()
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        # Structured output: compiles grammars on a worker thread, builds per-step bitmasks.
        self.structured_output_manager = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                                 self._eos_token_id())
        self._pending_outputs: list[RequestOutput] = []
        # The last step's scheduling decision, for views and tests (vLLM logs it with its stats).
        self.last_scheduler_output: SchedulerOutput | None = None

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _resolve_max_model_len(config: EngineConfig, hf_config: Any) -> int:
        model_limit = int(getattr(hf_config, "max_position_embeddings", 0) or 0)
        if config.max_model_len is None:
            if model_limit <= 0:
                raise ValueError("max_model_len must be given: the model config has no max_position_embeddings")
            return model_limit
        if model_limit and config.max_model_len > model_limit:
            raise ValueError(
                f"max_model_len ({config.max_model_len}) must be <= the model's "
                f"max_position_embeddings ({model_limit})"
            )
        return config.max_model_len

    @staticmethod
    @seam("kv_bytes_per_block")
    def kv_bytes_per_block(config: EngineConfig, hf_config: Any) -> int:
        """Bytes one KV block takes across all layers: 2 (K and V) x layers x block_size x kv_heads x head_size."""
        model_config = DecoderConfig.from_hf_config(hf_config)
        element_size = torch.empty((), dtype=config.torch_dtype).element_size()
        return (2 * model_config.num_hidden_layers * config.block_size * model_config.num_key_value_heads
                * model_config.head_dim * element_size)

    def _resolve_num_blocks(self, config: EngineConfig, hf_config: Any) -> int:
        """Total KV blocks INCLUDING the null block 0 (vLLM's num_gpu_blocks counts it too).

        Start-up as vLLM's (vllm/v1/worker/gpu_worker.py `determine_available_memory`, then
        vllm/v1/core/kv_cache_utils.py `get_kv_cache_config`): weights are loaded; a profiling run at the
        maximum batch measures the peak activation memory; the KV cache gets what remains of the budget.
        """
        self.startup_report = None   # what start-up measured (mini/engine/startup.py); None with an override
        if config.num_gpu_blocks_override is not None:
            return config.num_gpu_blocks_override
        from mini.engine.startup import determine_num_kv_blocks

        self.startup_report = determine_num_kv_blocks(self.model, config, hf_config,
                                                      self.kv_bytes_per_block(config, hf_config))
        return self.startup_report.num_gpu_blocks

    def _eos_token_id(self) -> int | None:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return int(self.tokenizer.eos_token_id)
        eos = getattr(self.hf_config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    # ------------------------------------------------------------------ the public loop
    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Validate and queue one request. Raises ValueError/TypeError and changes nothing on bad input."""
        if not isinstance(request_id, str) or not request_id:
            raise TypeError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in self.scheduler.requests or self.output_processor.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if self.config.speculative_config is not None and params.structured_outputs is not None:
            raise ValueError("structured_outputs cannot be used with speculative_config in mini: drafts are not "
                             "checked against the grammar; start an engine without speculative_config for it")
        arrival_time = time.time() if arrival_time is None else arrival_time
        core_request = self.input_processor.process(request_id, prompt, params, arrival_time, priority)

        # The scheduler goes first: it may still refuse a request that can never fit the KV pool,
        # and then nothing has been registered anywhere.
        if params.n == 1:
            request = Request.from_engine_core_request(core_request)
            self.scheduler.add_request(request)
            self.structured_output_manager.grammar_init(request)  # structured output: compile off the step loop
            self.output_processor.add_request(core_request)
            return
        parent = ParentRequest(core_request)
        for index in range(params.n):
            child_id, child_params = parent.get_child_info(index)
            child = dataclasses.replace(core_request, request_id=child_id, sampling_params=child_params)
            child_request = Request.from_engine_core_request(child)
            self.scheduler.add_request(child_request)
            self.structured_output_manager.grammar_init(child_request)  # structured output
            self.output_processor.add_request(child, parent, index)

    @seam("step")
    def step(self) -> list[RequestOutput]:
        """One engine iteration: schedule, run the model once, turn its tokens into outputs."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if not self.scheduler.has_unfinished_requests():
            return outputs
        scheduler_output = self.scheduler.schedule()
        self.last_scheduler_output = scheduler_output
        # Structured output: the constrained rows' token bitmask, as vLLM's EngineCore.step.
        grammar_output = self.structured_output_manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        runner_output = self.model_runner.execute_model(scheduler_output, grammar_output)
        if scheduler_output.total_num_scheduled_tokens == 0:  # structured output: only grammars left to wait for
            self.structured_output_manager.wait_for_compilation(timeout=0.01)
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        request_outputs, stopped_by_string = self.output_processor.process_outputs(core_outputs)
        if stopped_by_string:
            # A stop string is found by the detokenizer, after the scheduler already kept the request:
            # finish it there too so its blocks are freed now (vLLM does the same abort).
            self.scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)
        return outputs + request_outputs

    def abort_request(self, request_ids: list[str] | str) -> None:
        """Stop requests now; their blocks are freed at once and a final output has finish_reason 'abort'."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        internal_ids = self.output_processor.child_request_ids(ids)
        self.scheduler.finish_requests(internal_ids, RequestStatus.FINISHED_ABORTED)
        self._pending_outputs.extend(self.output_processor.abort_requests(ids))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (vLLM: `LLMEngine.reset_prefix_cache`).

        Refused (False, nothing changed) while a request holds blocks; True once the cache is empty.
        """
        return self.scheduler.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending_outputs) or self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("the tokenizer was not loaded (skip_tokenizer_init=True)")
        return self.tokenizer
