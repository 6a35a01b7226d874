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

`add_step_observer(fn)` (mini only) hands `fn` each step's `StepTrace` (mini/metrics/step_trace.py) for views,
traces and tests; stat loggers get counters (`get_scheduler_stats()`, vllm/v1/metrics/stats.py). An engine
with no observer builds no trace and copies no block table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.scheduler import Scheduler
from mini.engine import EngineCoreOutput, EngineCoreRequest
from mini.engine.input_processor import InputProcessor
from mini.engine.output_processor import OutputProcessor
from mini.engine.parallel_sampling import ParentRequest
from mini.engine.startup import determine_num_kv_blocks
from mini.metrics.stats import PoolSnapshot, SchedulerStats
from mini.metrics.step_trace import StepObserver, StepTrace
from mini.model.llama import DecoderConfig
from mini.model.loader import load_model
from mini.outputs import RequestOutput
from mini.roles import Choices, choose
from mini.runner_outputs import ModelRunnerOutput
from mini.sampling_params import SamplingParams
from mini.structured_output import GrammarOutput, StructuredOutputManager
from mini.tokenizer import load_tokenizer
from mini.worker.model_runner import ModelRunner


class LLMEngine:
    """Owns the scheduler, the KV cache manager, the model runner and the I/O processors."""

    def __init__(self, config: EngineConfig, parts: dict[str, Any] | None = None) -> None:
        self.config = config
        # Which implementation each role runs (mini/roles.py), chosen once here: `parts` on top of any
        # `mini.roles.use(...)` block the engine is built in (what the course's `labs.plug` opens).
        self.choices: Choices = choose(parts)
        torch.manual_seed(config.seed)
        model_dir = config.model_dir
        self.model, self.hf_config = load_model(str(model_dir), config.device, config.torch_dtype,
                                                choices=self.choices)
        self.tokenizer = None if config.skip_tokenizer_init else load_tokenizer(model_dir)

        max_model_len = self._resolve_max_model_len(config, self.hf_config)
        self.config = config = dataclasses.replace(config, max_model_len=max_model_len)
        self.vocab_size = int(self.hf_config.vocab_size)
        self.num_gpu_blocks = self._resolve_num_blocks(config, self.hf_config)

        self.kv_cache_manager = self.choices.resolve(KVCacheManager)(
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            hash_algo=config.prefix_caching_hash_algo,
            choices=self.choices,
        )
        self.scheduler = self.choices.resolve(Scheduler)(config, self.kv_cache_manager, self.choices)
        self.model_runner = self.choices.resolve(ModelRunner)(config, self.model, self.hf_config,
                                                              self.num_gpu_blocks, self.choices)
        self.input_processor = InputProcessor(
            self.tokenizer, self.vocab_size, max_model_len, self._eos_token_id()
        )
        self.output_processor = OutputProcessor(self.tokenizer, self.choices)
        # Structured output: compiles grammars on a worker thread, builds per-step bitmasks.
        self.structured_output_manager = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                                 self._eos_token_id(), choices=self.choices)
        self._pending_outputs: list[RequestOutput] = []
        # Called once at the end of every step that scheduled (views, traces, tests); none by default.
        self._step_observers: list[StepObserver] = []

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
    def process_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> EngineCoreRequest:
        """Validate and tokenize one request without queueing it (vLLM: `InputProcessor.process_inputs`).

        Raises ValueError/TypeError on bad input; changes nothing either way. `add_request` takes the result
        as its `prompt`, so a caller that checks a whole batch first (`LLM.generate`) tokenizes each prompt once.
        """
        if not isinstance(request_id, str) or not request_id:
            raise TypeError(f"request_id must be a non-empty str, got {request_id!r}")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if self.config.speculative_config is not None and params.structured_outputs is not None:
            raise ValueError("structured_outputs cannot be used with speculative_config in mini: drafts are not "
                             "checked against the grammar; start an engine without speculative_config for it")
        arrival_time = time.time() if arrival_time is None else arrival_time
        core_request = self.input_processor.process(request_id, prompt, params, arrival_time, priority)
        self._check_fits(core_request)
        return core_request

    def _check_fits(self, core_request: EngineCoreRequest) -> None:
        """A prompt must leave room for one sampled token in max_model_len and the KV pool (the scheduler
        refuses it otherwise); checked here too so that a batch is refused before any of it is queued."""
        max_request_len = self.scheduler.max_request_len
        num_tokens = len(core_request.prompt_token_ids)
        if num_tokens >= max_request_len:
            raise ValueError(f"prompt_token_ids has {num_tokens} tokens; at most {max_request_len - 1} fit, "
                             f"leaving one position for a sampled token (max_model_len={self.config.max_model_len}, "
                             f"KV pool capacity {self.kv_cache_manager.num_usable_tokens})")

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Validate and queue one request. Raises ValueError/TypeError and changes nothing on bad input.

        `prompt` is a prompt (text, or a `{"prompt_token_ids": ...}` dict), or the `EngineCoreRequest` that
        `process_request` returned for this `request_id` (vLLM's `LLMEngine.add_request` takes either);
        then `params`, `arrival_time` and `priority` are the request's own and the arguments are ignored.
        """
        if request_id in self.scheduler.requests or self.output_processor.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if isinstance(prompt, EngineCoreRequest):
            if prompt.request_id != request_id:
                raise ValueError(f"request_id {request_id!r} does not match the processed request's "
                                 f"{prompt.request_id!r}")
            core_request = prompt
        else:
            core_request = self.process_request(request_id, prompt, params, arrival_time, priority)
        self._queue(core_request)

    def _queue(self, core_request: EngineCoreRequest) -> None:
        """Register a processed request with the scheduler, structured output and the output processor.

        The scheduler goes first: it may still refuse a request that can never fit the KV pool, and then
        nothing has been registered anywhere."""
        params = core_request.sampling_params
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

    def step(self) -> list[RequestOutput]:
        """One engine iteration: schedule, run the model once, turn its tokens into outputs.

        With step observers attached (`add_step_observer`), each is called once at the end with the step's
        `StepTrace`; without, no trace is built."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if not self.scheduler.has_unfinished_requests():
            return outputs
        scheduler_output = self.scheduler.schedule()
        trace = self._new_trace(scheduler_output) if self._step_observers else None
        runner_output, core_outputs = self.execute_scheduled(scheduler_output, trace)
        request_outputs, stopped_by_string = self.output_processor.process_outputs(core_outputs)
        if stopped_by_string:
            # A stop string is found by the detokenizer, after the scheduler already kept the request:
            # finish it there too so its blocks are freed now (vLLM does the same abort).
            self.scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)
        outputs += request_outputs
        if trace is not None:
            self._notify_step_observers(trace, runner_output, outputs)
        return outputs

    def execute_scheduled(self, scheduler_output: SchedulerOutput, trace: StepTrace | None = None
                          ) -> tuple[ModelRunnerOutput, list[EngineCoreOutput]]:
        """The rest of vLLM's `EngineCore.step` after `schedule()`: the grammar bitmask, the model, the
        scheduler's update -> (the runner's output, the engine-core outputs of the requests that progressed)."""
        # Structured output: the constrained rows' token bitmask, as vLLM's EngineCore.step.
        grammar_output = self._grammar_output(scheduler_output, trace)
        runner_output = self.model_runner.execute_model(scheduler_output, grammar_output, trace=trace)
        if scheduler_output.total_num_scheduled_tokens == 0:  # structured output: only grammars left to wait for
            self.structured_output_manager.wait_for_compilation(timeout=0.01)
        return runner_output, self.scheduler.update_from_output(scheduler_output, runner_output)

    def _grammar_output(self, scheduler_output: SchedulerOutput, trace: StepTrace | None) -> GrammarOutput | None:
        manager = self.structured_output_manager
        if trace is None:
            return manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        started = time.perf_counter()
        grammar_output = manager.grammar_bitmask(self.scheduler.requests, scheduler_output)
        if grammar_output is not None:
            trace.grammar_mask_seconds = time.perf_counter() - started
        return grammar_output

    # ------------------------------------------------------------------ observing the engine
    def add_step_observer(self, observer: StepObserver) -> Callable[[], None]:
        """Call `observer(trace)` at the end of every step that schedules; returns a function removing it.

        The `StepTrace` (mini/metrics/step_trace.py) holds the step's SchedulerOutput, the runner's flat
        inputs, the persistent batch's BatchUpdate, the sampled tokens and the outputs; `trace.snapshot()`,
        called inside the observer, copies the queues and the KV pool (nothing is copied otherwise).
        """
        if not callable(observer):
            raise TypeError(f"a step observer must be callable, got {type(observer).__name__}")
        self._step_observers.append(observer)
        return lambda: self.remove_step_observer(observer)

    def remove_step_observer(self, observer: StepObserver) -> None:
        """Stop calling `observer` (nothing happens if it is not attached)."""
        if observer in self._step_observers:
            self._step_observers.remove(observer)

    def get_scheduler_stats(self) -> SchedulerStats:
        """The scheduler's counters now (vLLM hands the same `SchedulerStats` to its stat loggers)."""
        return SchedulerStats.from_scheduler(self.scheduler)

    def snapshot_pool(self) -> PoolSnapshot:
        """A copy of the scheduler's queues and the KV pool now (block tables, free queue, ref counts)."""
        return PoolSnapshot.from_scheduler(self.scheduler)

    def _new_trace(self, scheduler_output: SchedulerOutput) -> StepTrace:
        return StepTrace(step=self.scheduler.step_index, scheduler_output=scheduler_output,
                         _take_snapshot=self.snapshot_pool)

    def _notify_step_observers(self, trace: StepTrace, runner_output: Any, outputs: list[RequestOutput]) -> None:
        trace.req_ids = list(runner_output.req_ids)
        trace.sampled_token_ids = runner_output.sampled_token_ids
        trace.outputs = list(outputs)
        try:
            for observer in list(self._step_observers):
                observer(trace)
        finally:
            trace.close()

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
