"""The engine's front end: add_request -> step -> outputs, with abort.

Mirrors vllm/v1/engine/llm_engine.py (LLMEngine). The engine is two halves, as vLLM's:

    front end (this file)   InputProcessor.process      text -> token ids, validation
                                                        (vllm/v1/engine/input_processor.py)
                            OutputProcessor             detokenize, stop strings, RequestOutput
                                                        (vllm/v1/engine/output_processor.py)
    engine core             EngineCore (mini/engine/core.py): Scheduler.schedule -> Executor.execute_model ->
                            Scheduler.update_from_output, token ids in and out (vllm/v1/engine/core.py)

`step` asks the core for one step and turns its `EngineCoreOutput`s into `RequestOutput`s, then finishes in
the core the requests a stop string ended (the detokenizer finds those; vLLM aborts them the same way).
`scheduler`, `model_runner`, `kv_cache_manager`, ... are the in-process core's parts, for views and tests.

`self.engine_core` is an engine-core client (mini/engine/core_client.py, vLLM's `EngineCoreClient`):
`SyncMPClient` by default (the core in a child process, mini/engine/core_proc.py), `InprocClient` with
`MINI_ENABLE_V1_MULTIPROCESSING=0`. Only in-process are the core's parts and step observers reachable from
here; in multiprocess mode they raise `EngineInternalsError` naming the switch.

`add_step_observer(fn)` (mini only) attaches `fn` to the in-process core, whose one `EngineCore.step` hands it
each step's `StepTrace` (mini/metrics/step_trace.py) for views, traces and tests; stat loggers get counters
(`get_scheduler_stats()`, vllm/v1/metrics/stats.py). An engine with no observer builds no trace and copies no
block table.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from mini import roles
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import RequestStatus
from mini.core.sched.scheduler import Scheduler
from mini.engine import EngineCoreRequest
from mini.engine.core import EngineCore
from mini.engine.core_client import EngineCoreClient, multiprocessing_enabled
from mini.engine.exceptions import EngineStepError
from mini.engine.input_processor import InputProcessor
from mini.engine.output_processor import OutputProcessor
from mini.engine.parallel_sampling import ParentRequest
from mini.metrics.stats import PoolSnapshot, SchedulerStats
from mini.metrics.step_trace import StepObserver
from mini.outputs import RequestOutput
from mini.sampling_params import SamplingParams
from mini.structured_output import StructuredOutputManager
from mini.tokenizer import load_tokenizer
from mini.worker.model_runner import ModelRunner
from mini.worker.startup import kv_bytes_per_block

# Multiprocess mode: how long `step()` waits for the core's next outputs before returning none.
STEP_WAIT_S = 1.0


class LLMEngine:
    """The front end (input and output processors) around an engine core (scheduler, executor)."""

    def __init__(self, config: EngineConfig, parts: dict[str, Any] | None = None, *,
                 asyncio_mode: bool = False) -> None:
        """`asyncio_mode`: the client is an asyncio one (`AsyncMPClient` / `DPAsyncMPClient`, in process
        `AsyncInprocClient`) for `AsyncLLM`'s output-handler task (mini/engine/async_llm.py); `step()` is then not
        used."""
        # Which implementation each role runs (mini/roles.py), chosen once here and carried by the config
        # (`config.parts`): `parts` on top of any `mini.roles.use(...)` block the engine is built in (what the
        # course's `labs.plug` opens). Each component resolves its class from the config where it is built.
        config = roles.with_pending(config, parts)
        # In a child process (SyncMPClient) unless MINI_ENABLE_V1_MULTIPROCESSING=0 (InprocClient).
        self.multiprocess_mode = multiprocessing_enabled()
        if config.tensor_parallel_size > 1:   # a size the heads do not divide: refused before any process starts
            from mini.executor.multiproc_executor import verify_tensor_parallel_config
            verify_tensor_parallel_config(config)
        if config.data_parallel_size > 1:     # N cores, each request to the least loaded (the server's AsyncLLM)
            from mini.engine.dp_client import make_dp_client
            self.engine_core = make_dp_client(self.multiprocess_mode, config, asyncio_mode)
        else:
            # A child core loads its own tokenizer; the front end loads this one while the child starts (an
            # in-process client shares its core's instead and never calls it).
            load_front_end_tokenizer = None
            if not config.skip_tokenizer_init:
                load_front_end_tokenizer = functools.partial(load_tokenizer, config.model_dir)
            self.engine_core = EngineCoreClient.make_client(self.multiprocess_mode, asyncio_mode, config,
                                                            while_starting=load_front_end_tokenizer)
        info = self.engine_core.startup
        self._num_gpu_blocks = int(info["num_gpu_blocks"])
        self.config = config = dataclasses.replace(config, max_model_len=info["max_model_len"])
        self.vocab_size = int(info["vocab_size"])
        self.max_request_len = int(info["max_request_len"])
        self.num_usable_tokens = int(info["num_usable_tokens"])
        if config.skip_tokenizer_init:
            self.tokenizer = None
        else:   # the in-process core's, or the one loaded while the child started (none from a DP client)
            tokenizer = self.engine_core.started_alongside
            self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model_dir)
        self.eos_token_id = info["eos_token_id"]     # the tokenizer's, else the checkpoint config's
        self.input_processor = InputProcessor(self.tokenizer, self.vocab_size, config.max_model_len,
                                              self.eos_token_id, lora_checker=self._lora_checker(config))
        self.output_processor = OutputProcessor(self.tokenizer, config)
        self._pending_outputs: list[RequestOutput] = []

    # ------------------------------------------------------------------ the engine core's parts
    # An in-process engine core's pieces, for the course's views and the tests that look inside.
    def _core(self, name: str) -> EngineCore:
        """The in-process `EngineCore`; in multiprocess mode an error naming `name` and the switch."""
        return self.engine_core.local_core(name)

    @property
    def scheduler(self) -> Scheduler:
        return self._core("scheduler").scheduler

    @property
    def kv_cache_manager(self) -> KVCacheManager:
        return self._core("kv_cache_manager").kv_cache_manager

    @property
    def structured_output_manager(self) -> StructuredOutputManager:
        return self._core("structured_output_manager").structured_output_manager

    @property
    def model_executor(self) -> Any:
        return self._core("model_executor").model_executor

    @property
    def model_runner(self) -> ModelRunner:
        return self._core("model_runner").model_executor.model_runner

    @property
    def model(self) -> Any:
        return self._core("model").model_executor.model

    @property
    def hf_config(self) -> Any:
        return self._core("hf_config").hf_config

    @property
    def num_gpu_blocks(self) -> int:
        return self._num_gpu_blocks

    @property
    def startup_report(self) -> Any:
        """What start-up measured (mini/worker/startup.py); None with `num_gpu_blocks_override`."""
        return self._core("startup_report").startup_report

    @staticmethod
    def kv_bytes_per_block(config: EngineConfig, hf_config: Any) -> int:
        """Bytes one KV block takes across all layers: 2 (K and V) x layers x block_size x kv_heads x head_size."""
        return kv_bytes_per_block(config, hf_config)

    @staticmethod
    def _lora_checker(config: EngineConfig) -> Any | None:
        """With enable_lora, what checks each request's adapter against the base model (mini/lora/)."""
        if not config.enable_lora:
            return None
        from mini.lora.peft_helper import AdapterChecker
        from mini.model.llama import DecoderConfig
        from mini.model.loader import read_hf_config
        return AdapterChecker(DecoderConfig.from_hf_config(read_hf_config(config.model_dir)), config.max_lora_rank)

    def _eos_token_id(self) -> int | None:
        return self.eos_token_id

    # ------------------------------------------------------------------ the public loop
    def process_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: Any | None = None,
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
        core_request = self.input_processor.process(request_id, prompt, params, arrival_time, priority,
                                                    lora_request=lora_request)
        self._check_fits(core_request)
        return core_request

    def _check_fits(self, core_request: EngineCoreRequest) -> None:
        """A prompt must leave room for one sampled token in max_model_len and the KV pool (the scheduler
        refuses it otherwise); checked here too so that a batch is refused before any of it is queued."""
        max_request_len = self.max_request_len
        num_tokens = len(core_request.prompt_token_ids)
        if num_tokens >= max_request_len:
            raise ValueError(f"prompt_token_ids has {num_tokens} tokens; at most {max_request_len - 1} fit, "
                             f"leaving one position for a sampled token (max_model_len={self.config.max_model_len}, "
                             f"KV pool capacity {self.num_usable_tokens})")

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: Any | None = None,
    ) -> None:
        """Validate and queue one request. Raises ValueError/TypeError and changes nothing on bad input.

        `prompt` is a prompt (text, or a `{"prompt_token_ids": ...}` dict), or the `EngineCoreRequest` that
        `process_request` returned for this `request_id` (vLLM's `LLMEngine.add_request` takes either);
        then `params`, `arrival_time` and `priority` are the request's own and the arguments are ignored.
        """
        if self.output_processor.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if isinstance(prompt, EngineCoreRequest):
            if prompt.request_id != request_id:
                raise ValueError(f"request_id {request_id!r} does not match the processed request's "
                                 f"{prompt.request_id!r}")
            core_request = prompt
        else:
            core_request = self.process_request(request_id, prompt, params, arrival_time, priority, lora_request)
        self._queue(core_request)

    def _queue(self, core_request: EngineCoreRequest) -> None:
        """Register a processed request with the scheduler, structured output and the output processor.

        The scheduler goes first: it may still refuse a request that can never fit the KV pool, and then
        nothing has been registered anywhere."""
        params = core_request.sampling_params
        if params.n == 1:
            self.engine_core.add_request(core_request)
            self.output_processor.add_request(core_request)
            return
        parent = ParentRequest(core_request)
        for index in range(params.n):
            child_id, child_params = parent.get_child_info(index)
            child = dataclasses.replace(core_request, request_id=child_id, sampling_params=child_params)
            self.engine_core.add_request(child)
            self.output_processor.add_request(child, parent, index)

    def step(self) -> list[RequestOutput]:
        """One engine iteration: the core's next step's outputs (in process: one `EngineCore.step()`; in a
        child process: what it sent, or none after `STEP_WAIT_S`), turned into `RequestOutput`s."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if not self.has_unfinished_requests():
            return outputs
        engine_core_outputs = self.engine_core.get_output(timeout=STEP_WAIT_S)
        if engine_core_outputs.failed_requests:
            self._fail_requests(engine_core_outputs.failed_requests)
        return outputs + self._process_core_outputs(engine_core_outputs.outputs)

    def _fail_requests(self, failed: dict[str, str]) -> None:
        """A step raised in the engine-core process: it aborted these requests; forget them here and raise."""
        for request_id in failed:
            self.output_processor.abort_requests([request_id])
        first = next(iter(failed.values()))
        raise EngineStepError(f"{first} (requests aborted: {sorted(failed)})")

    def _process_core_outputs(self, core_outputs: list) -> list[RequestOutput]:
        """Detokenize the core's outputs; finish the requests a stop string ended."""
        request_outputs, stopped_by_string = self.output_processor.process_outputs(core_outputs)
        if stopped_by_string:
            # A stop string is found by the detokenizer, after the scheduler already kept the request:
            # finish it there too so its blocks are freed now (vLLM does the same abort).
            self.engine_core.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)
        return request_outputs

    # ------------------------------------------------------------------ observing the engine
    def add_step_observer(self, observer: StepObserver) -> Callable[[], None]:
        """Call `observer(trace)` at the end of every step that schedules; returns a function removing it.

        The `StepTrace` (mini/metrics/step_trace.py) holds the step's SchedulerOutput, the runner's flat
        inputs, the persistent batch's BatchUpdate, the sampled tokens and the core's outputs;
        `trace.snapshot()`, called inside the observer, copies the queues and the KV pool (nothing is copied
        otherwise). The core feeds it from its one `step` (mini/engine/core.py), so it is in-process only.
        """
        return self._core("add_step_observer").add_step_observer(observer)

    def remove_step_observer(self, observer: StepObserver) -> None:
        """Stop calling `observer` (nothing happens if it is not attached)."""
        self._core("remove_step_observer").remove_step_observer(observer)

    def get_scheduler_stats(self) -> SchedulerStats:
        """The scheduler's counters now (vLLM hands the same `SchedulerStats` to its stat loggers)."""
        return self.engine_core.get_scheduler_stats()

    def step_scheduler_stats(self) -> SchedulerStats:
        """The counters as of the last step: what the multiprocess core sent with its outputs (no round trip),
        else the scheduler's now."""
        latest = getattr(self.engine_core, "latest_scheduler_stats", None)
        return latest if latest is not None else self.engine_core.get_scheduler_stats()

    def snapshot_pool(self) -> PoolSnapshot:
        """A copy of the scheduler's queues and the KV pool now (block tables, free queue, ref counts)."""
        return self._core("snapshot_pool").snapshot_pool()

    def abort_request(self, request_ids: list[str] | str) -> None:
        """Stop requests now; their blocks are freed at once and a final output has finish_reason 'abort'."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        internal_ids = self.output_processor.child_request_ids(ids)
        self.engine_core.abort_requests(internal_ids)
        self._pending_outputs.extend(self.output_processor.abort_requests(ids))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (vLLM: `LLMEngine.reset_prefix_cache`).

        Refused (False, nothing changed) while a request holds blocks; True once the cache is empty.
        """
        return self.engine_core.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        """The front end's view, as vLLM's, or work only the core can see (`EngineCoreClient.has_work`: an
        in-process core's steps still in flight; a child process finishes its own)."""
        return (bool(self._pending_outputs) or self.output_processor.has_unfinished_requests()
                or self.engine_core.has_work())

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def shutdown(self) -> None:
        """Stop the engine core (its process, in multiprocess mode). Idempotent; also run when collected."""
        self.engine_core.shutdown()

    def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("the tokenizer was not loaded (skip_tokenizer_init=True)")
        return self.tokenizer
