"""`AsyncLLM` in multiprocess mode: the front end on the event loop, the engine core in a child process.

Why a file apart from async_llm.py (vLLM has one AsyncLLM): mini keeps an in-process AsyncLLM too (a thread
design, for the course's views), and the two front ends do not fit one small file yet.

Mirrors vllm/v1/engine/async_llm.py: `AsyncLLM.__init__` builds the input and output processors in this
process and an asyncio engine-core client (`AsyncMPClient`, vllm/v1/engine/core_client.py; with data
parallelism `DPAsyncMPClient`, mini/engine/dp_client.py); `_run_output_handler` starts ONE asyncio task, on
first use, that loops

    outputs = await engine_core.outputs_async()          # the next step's EngineCoreOutputs, any core
    request_outputs, reqs_to_abort = output_processor.process_outputs(outputs.outputs)
    each RequestOutput -> its request's RequestOutputCollector (mini/engine/async_llm.py)
    finish in the core the requests a stop string ended   # the core cannot see text
    stat loggers <- (outputs.scheduler_stats, IterationStats)

which is phase 13's `output_handler_step` plus the statistics and failed steps; `generate()` is phase 13's
`generate_stream` (register a collector, add the request to the output processor and the core, await the
collector; a consumer that goes away aborts the request in both) plus parallel sampling (n > 1: the
children go to the core, the parent's id to the collector). Nothing here blocks the loop: the input processing
(tokenizing, checking a grammar) runs on one worker thread (vLLM's renderer executor), detokenizing on the loop
(as in vLLM), the model in the core's process.

Where mini differs, and why:
  * The task and the client belong to the loop of the first `generate()` (an `AsyncMPClient` serves one loop,
    as vLLM's). `get_scheduler_stats()` and `abort()` also work from another loop or thread (a test or a
    second thread asking the server's engine): they are run on the engine's loop and awaited.
  * An engine built with `MINI_ENABLE_V1_MULTIPROCESSING=0`, or around a given in-process `LLMEngine`, keeps
    the thread design of mini/engine/async_llm.py: an in-process core's step would block the loop (vLLM has
    no in-process asyncio engine either: its `AsyncLLM` always runs the core as a process).
  * A failed step (`failed_requests`: the core aborted those requests and goes on) fails those streams with
    `EngineStepError`; a dead core (`EngineDeadError` from the client) fails every stream at once, and
    `is_running` / `errored` turn /health to 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from mini.config import EngineConfig, engine_config_from_args
from mini.core.request import RequestStatus
from mini.engine.exceptions import EngineDeadError, EngineStepError
from mini.engine.llm_engine import LLMEngine
from mini.engine.output_processor import RequestOutputCollector
from mini.metrics.stats import IterationStats, RequestTiming, SchedulerStats, StatLogger, record_output
from mini.outputs import RequestOutput
from mini.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class MPAsyncLLM:
    """Front end + AsyncMPClient + an output-handler task (vLLM's AsyncLLM); built by `AsyncLLM(...)`."""

    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None,
                 stat_loggers: list[StatLogger] | None = None) -> None:
        if engine is not None:
            raise TypeError("MPAsyncLLM builds its own front end; AsyncLLM(engine=...) runs the thread design")
        self.engine = LLMEngine(config or EngineConfig(), asyncio_mode=True)
        self._owns_engine = True
        self.config = self.engine.config
        self.engine_core = self.engine.engine_core            # AsyncMPClient or DPAsyncMPClient
        self.output_processor = self.engine.output_processor
        self.stat_loggers: list[StatLogger] = list(stat_loggers or [])
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._timings: dict[str, RequestTiming] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.output_handler: asyncio.Task | None = None
        self._dead_error: BaseException | None = None
        self._stopped = False
        self._input_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mini-input")

    @classmethod
    def from_engine_args(cls, **engine_args: Any) -> MPAsyncLLM:
        """MPAsyncLLM(model=..., max_num_seqs=..., ...) with the same arguments as `LLM(...)`."""
        return cls(engine_config_from_args(**engine_args))

    # ------------------------------------------------------------------ state
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def is_running(self) -> bool:
        return not self._stopped and self._dead_error is None

    @property
    def errored(self) -> bool:
        return self._dead_error is not None

    def _check_alive(self) -> None:
        if self._dead_error is not None:
            raise EngineDeadError(f"the engine core has stopped: {self._dead_error}")
        if self._stopped:
            raise EngineDeadError("the engine has been shut down")

    def _start_output_handler(self) -> None:
        """On first use: bind the client to this loop and start the output-handler task (vLLM's
        `_run_output_handler`)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError("this AsyncLLM serves the event loop of its first generate(); call it from there")
        self._loop = loop
        self.engine_core._ensure_started()    # the output socket moves to this loop before any request
        self.output_handler = loop.create_task(self._output_handler(), name="mini-output-handler")

    # ------------------------------------------------------------------ the public surface
    async def generate(self, prompt: Any, sampling_params: SamplingParams | None, request_id: str,
                       priority: int = 0, lora_request: Any = None) -> AsyncGenerator[RequestOutput, None]:
        """Stream the request's outputs; the last has `finished=True` (phase 13's `generate_stream`).

        Bad input raises ValueError/TypeError before anything is queued; a consumer that goes away aborts."""
        self._check_alive()
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if self.output_processor.has_request(request_id) or request_id in self._collectors:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        self._start_output_handler()
        collector = RequestOutputCollector(params.output_kind, self._loop)
        self._collectors[request_id] = collector      # the id is taken while its input is processed
        try:
            # Tokenizing a long prompt or checking a large grammar takes seconds: on a worker thread, not
            # the event loop (vLLM's renderer executor, vllm/renderers/hf.py), so every other stream and
            # /health keep going meanwhile.
            request = await self._loop.run_in_executor(
                self._input_executor, functools.partial(self.engine.process_request, request_id, prompt, params,
                                                        priority=priority, lora_request=lora_request))
            self._check_alive()
            self._timings[request_id] = RequestTiming(time.monotonic(), params.output_kind)
            self.engine._queue(request)   # the output processor, then the core (n > 1: each child)
        except BaseException:
            self._forget(request_id)
            raise
        finished = False
        try:
            while not finished:
                output = await collector.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self._abort_now([request_id], quiet=True)

    async def abort(self, request_id: str | list[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their streams end with finish_reason 'abort'."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._loop is None or self._loop is asyncio.get_running_loop():
            self._abort_now(ids, quiet=False)
        else:
            self._loop.call_soon_threadsafe(self._abort_now, ids, False)

    async def get_scheduler_stats(self) -> SchedulerStats:
        """The core's counters now (a utility call); from any loop or thread."""
        self._check_alive()
        if self._loop is None or self._loop is asyncio.get_running_loop():
            if self._loop is None:
                self._start_output_handler()
            return await self.engine_core.get_scheduler_stats_async()
        future = asyncio.run_coroutine_threadsafe(self.engine_core.get_scheduler_stats_async(), self._loop)
        return await asyncio.wrap_future(future)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the core's process; streams still open get EngineDeadError. Idempotent, from any thread."""
        self._stopped = True
        self._fail_all(EngineDeadError("the engine has been shut down"))
        handler, loop = self.output_handler, self._loop
        if handler is not None and not handler.done() and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(handler.cancel)
        self._input_executor.shutdown(wait=False, cancel_futures=True)
        self.engine.shutdown()

    # ------------------------------------------------------------------ the output handler
    async def _output_handler(self) -> None:
        """vLLM's `output_handler`: core outputs -> RequestOutputs -> collectors; stop strings -> abort."""
        try:
            while True:
                outputs = await self.engine_core.outputs_async()
                if outputs.failed_requests:
                    self._fail_requests(outputs.failed_requests)
                request_outputs, reqs_to_abort = self.output_processor.process_outputs(outputs.outputs)
                iteration = IterationStats()
                now = time.monotonic()
                for output in request_outputs:
                    self._route(output, now, iteration)
                if reqs_to_abort:   # the detokenizer found a stop string: free the blocks in the core now
                    self.engine_core.finish_requests(reqs_to_abort, RequestStatus.FINISHED_STOPPED)
                self._log_stats(outputs.scheduler_stats, iteration)
        except Exception as error:  # noqa: BLE001  (the core died, or a bug here: fail every stream)
            if not self._stopped:
                logger.error("the output handler stopped: %r", error)
                self._dead_error = error
            dead = error if isinstance(error, EngineDeadError) else EngineDeadError(f"the engine failed: {error!r}")
            self._fail_all(dead)

    def _route(self, output: RequestOutput, now: float, iteration: IterationStats) -> None:
        rid = output.request_id
        collector, timing = self._collectors.get(rid), self._timings.get(rid)
        if output.finished:
            self._forget(rid)
        if timing is not None:
            record_output(output, timing, now, iteration)
        if collector is not None:
            collector.put(output)

    def _log_stats(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats) -> None:
        scheduler_stats = scheduler_stats or self.engine_core.latest_scheduler_stats
        if scheduler_stats is None:
            return
        for stat_logger in self.stat_loggers:
            try:
                stat_logger(scheduler_stats, iteration)
            except Exception:
                logger.exception("stat logger %r failed", stat_logger)

    def _fail_requests(self, failed: dict[str, str]) -> None:
        """A step failed in the core: it aborted these (child) ids; their streams get EngineStepError."""
        first = next(iter(failed.values()))
        error = EngineStepError(f"the engine step failed: {first} (requests aborted: {sorted(failed)})")
        parents = {rid for rid in self._collectors
                   if set(self.output_processor.child_request_ids([rid])) & set(failed) or rid in failed}
        self.output_processor.abort_requests(list(failed))
        for rid in parents:
            collector = self._collectors.get(rid)
            self._forget(rid)
            if collector is not None:
                collector.put(error)

    def _abort_now(self, request_ids: list[str], quiet: bool) -> None:
        """Abort in the output processor (final 'abort' outputs to the collectors) and in the core."""
        live = [rid for rid in request_ids if self.output_processor.has_request(rid)]
        if not live:
            for rid in request_ids:
                self._forget(rid)
            return
        core_ids = self.output_processor.child_request_ids(live)
        iteration, now = IterationStats(), time.monotonic()
        for output in self.output_processor.abort_requests(live):
            collector, timing = self._collectors.get(output.request_id), self._timings.get(output.request_id)
            self._forget(output.request_id)
            if timing is not None:    # counted as finished with reason "abort", as the thread design does
                record_output(output, timing, now, iteration)
            if collector is not None and not quiet:
                collector.put(output)
        for rid in request_ids:
            self._forget(rid)
        if iteration.finished_requests:
            self._log_stats(None, iteration)
        with contextlib.suppress(EngineDeadError):   # the core is gone: nothing holds blocks any more
            self.engine_core.abort_requests(core_ids)

    def _forget(self, request_id: str) -> None:
        self._collectors.pop(request_id, None)
        self._timings.pop(request_id, None)

    def _fail_all(self, error: BaseException) -> None:
        collectors, self._collectors = self._collectors, {}
        self._timings.clear()
        for collector in collectors.values():
            collector.put_threadsafe(error)


__all__ = ["MPAsyncLLM"]
