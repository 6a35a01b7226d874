"""`AsyncLLM`: one engine, many callers streaming from it, over an asyncio engine-core client.

Mirrors vllm/v1/engine/async_llm.py: `AsyncLLM.__init__` builds the input and output processors in this process
and an asyncio engine-core client (vllm/v1/engine/core_client.py: `EngineCoreClient.make_async_mp_client`);
`_run_output_handler` starts ONE asyncio task, on first use, that loops

    outputs = await engine_core.outputs_async()          # the next step's EngineCoreOutputs, any core
    request_outputs, reqs_to_abort = output_processor.process_outputs(outputs.outputs)
    each RequestOutput -> its request's RequestOutputCollector (mini/engine/output_processor.py)
    finish in the core the requests a stop string ended   # the core cannot see text
    stat loggers <- (outputs.scheduler_stats, IterationStats)

which is phase 13's `output_handler_step` plus the statistics and failed steps; `generate()` is phase 13's
`generate_stream` (register a collector, add the request to the output processor and the core, await the
collector; a consumer that goes away aborts the request in both) plus parallel sampling (n > 1: the children go
to the core, the parent's id to the collector). Nothing here blocks the loop: the input processing (tokenizing,
checking a grammar) runs on one worker thread (vLLM's renderer executor), detokenizing on the loop (as in vLLM),
the model in the core.

Which client (mini/engine/core_client.py) is the only difference between the modes:
  * `AsyncMPClient` (the default): the core in a child process; `DPAsyncMPClient` (mini/engine/dp_client.py)
    with `data_parallel_size` > 1.
  * `AsyncInprocClient` (`MINI_ENABLE_V1_MULTIPROCESSING=0`, or `AsyncLLM(engine=an in-process LLMEngine)`):
    the core in this process, stepped by one background thread, so that the course's views and the tests can look
    inside it (`async_llm.engine.scheduler`, ...). vLLM has no such mode for its AsyncLLM.

Back-pressure: each request's `RequestOutputCollector` holds at most ONE pending output: a slow reader gets the
new deltas merged into it (DELTA) or, sample by sample, the newer snapshot replacing it (CUMULATIVE /
FINAL_ONLY), as vLLM's collector does; the scheduler runs at most `max_num_seqs` requests and
`max_num_batched_tokens` tokens a step and keeps the rest waiting.

Where mini differs, and why:
  * The task and the client belong to the loop of the first `generate()` (an `AsyncMPClient` serves one loop,
    as vLLM's; the in-process client moves to a new loop once the old one is closed). `get_scheduler_stats()`
    and `abort()` also work from another loop or thread (a test or a second thread asking the server's engine):
    they are run on the engine's loop and awaited.
  * A failed step (`failed_requests`: the core aborted those requests and goes on) fails those streams with
    `EngineStepError`; a dead core (`EngineDeadError` from the client) fails every stream at once, and
    `is_running` / `errored` turn /health to 503.

Statistics: each step's `(SchedulerStats, IterationStats)` goes to each stat logger (vllm/v1/metrics/loggers.py):
counters only (no block table is copied; a teaching view that wants the pool attaches a step observer to the
engine instead); `IterationStats` carries the step's token counts and the per-request latencies measured when
outputs leave the engine (time to first token, inter-token, end-to-end). A FINAL_ONLY request produces one
output only, so its first-token time is its end-to-end time; the OpenAI server streams internally with DELTA
for that reason.
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
from mini.engine.core_client import AsyncInprocClient
from mini.engine.exceptions import EngineDeadError, EngineStepError
from mini.engine.llm_engine import LLMEngine
from mini.engine.output_processor import (  # re-exported: phase 13 imports them from here
    OutputProcessor,
    RequestOutputCollector,
    merge_delta_outputs,
)
from mini.metrics.stats import (  # re-exported: phase 13 imports them from here
    FinishedRequestStats,
    IterationStats,
    RequestTiming,
    SchedulerStats,
    StatLogger,
    record_output,
)
from mini.outputs import RequestOutput
from mini.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


# EngineDeadError, EngineStepError: mini/engine/exceptions.py (vllm/v1/engine/exceptions.py), re-exported here.


# ---------------------------------------------------------------------------- vLLM's front-end shape
# vLLM's AsyncLLM splits each step in two: the engine core (another process) schedules, runs the model and
# returns `EngineCoreOutput`s (token ids); the front end's `output_handler` task turns them into
# `RequestOutput`s with the output processor, pushes each into its request's collector, and tells the core
# to abort the requests a stop string finished (the core cannot see text). `generate()` aborts a request
# whose consumer went away. `AsyncLLM` below runs exactly this over its client (`_output_handler`, `generate`),
# plus statistics, failed steps and n > 1. The three pieces below are that split written as vLLM writes it; the
# course (phase 13) has the learner write the first two.
async def output_handler_step(engine_core: Any, output_processor: Any,
                              collectors: dict[str, RequestOutputCollector]) -> None:
    """One iteration of vLLM's `output_handler` loop (vllm/v1/engine/async_llm.py `_run_output_handler`).

    Pull the next `EngineCoreOutput`s, process them, push each `RequestOutput` to its request's collector (a
    finished request's collector leaves `collectors`), then abort in the core the requests the output
    processor finished by a stop string.
    """
    engine_core_outputs = await engine_core.get_output_async()
    request_outputs, reqs_to_abort = output_processor.process_outputs(engine_core_outputs)
    for output in request_outputs:
        collector = collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)
        if collector is not None:
            collector.put(output)
    if reqs_to_abort:
        await engine_core.abort_requests_async(reqs_to_abort)


async def generate_stream(engine_core: Any, output_processor: Any, collectors: dict[str, RequestOutputCollector],
                          request: Any) -> AsyncGenerator[RequestOutput, None]:
    """vLLM's `AsyncLLM.generate` for one processed request (`EngineCoreRequest`, n == 1).

    Register a collector, add the request to the output processor and the engine core, yield its outputs
    until the finished one. A consumer that goes away (its task cancelled: `CancelledError`; the generator
    closed: `GeneratorExit`) aborts the request in the output processor and in the engine core, then the
    exception goes on.
    """
    request_id = request.request_id
    collector = RequestOutputCollector(request.sampling_params.output_kind, asyncio.get_running_loop())
    collectors[request_id] = collector
    output_processor.add_request(request)
    await engine_core.add_request_async(request)
    finished = False
    try:
        while not finished:
            output = await collector.get()
            finished = output.finished
            yield output
    except (asyncio.CancelledError, GeneratorExit):
        collectors.pop(request_id, None)
        output_processor.abort_requests([request_id])
        await engine_core.abort_requests_async([request_id])
        raise


class InprocEngineCore:
    """An engine core in this process: an `LLMEngine`'s scheduler and model runner, not its output processor.

    Mirrors `EngineCore.step` (vllm/v1/engine/core.py: schedule, execute, update_from_output) behind the async
    surface of `AsyncMPClient` (vllm/v1/engine/core_client.py: `add_request_async`, `abort_requests_async`,
    `get_output_async`). The step runs inline, blocking the event loop for its duration (mini's `AsyncLLM`
    runs it on a thread instead). `output_processor` is a fresh front-end `OutputProcessor` for the caller.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        # The EngineCore itself (an engine built with MINI_ENABLE_V1_MULTIPROCESSING=1 raises here, naming the
        # switch; its asyncio counterpart is mini.engine.core_client.AsyncMPClient).
        self.core = engine._core("engine_core")
        self.output_processor = OutputProcessor(engine.tokenizer, engine.config)
        self.aborted: list[str] = []   # every id the front end aborted, in order (for tests and views)

    async def add_request_async(self, request: Any) -> None:
        self.core.add_request(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)
        self.core.abort_requests(list(request_ids))

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[Any]:
        """One engine-core step -> the `EngineCoreOutput`s of the requests that progressed."""
        return self.core.step()

    async def get_output_async(self) -> list[Any]:
        await asyncio.sleep(0)   # let the consumers run between two steps
        return self.step()


# ---------------------------------------------------------------------------- the engine
class AsyncLLM:
    """Front end + an asyncio engine-core client + an output-handler task (vLLM's AsyncLLM).

    `AsyncLLM(config)` builds its `LLMEngine` (front end) with the client `MINI_ENABLE_V1_MULTIPROCESSING` picks;
    `AsyncLLM(engine=an in-process LLMEngine)` steps that engine's core on a thread (`AsyncInprocClient`) until
    `shutdown()`, which hands the engine its own client back (the engine is not shut down)."""

    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None,
                 stat_loggers: list[StatLogger] | None = None) -> None:
        self._owns_engine = engine is None
        self._given_client: Any = None
        if engine is None:
            engine = LLMEngine(config or EngineConfig(), asyncio_mode=True)
        elif not hasattr(engine.engine_core, "outputs_async"):
            # A sync client: its core in this process (else EngineInternalsError naming the switch), on a thread.
            self._given_client = engine.engine_core
            engine.engine_core = AsyncInprocClient(engine_core=engine.engine_core.local_core("AsyncLLM(engine=...)"))
        self.engine = engine
        self.config = self.engine.config
        self.engine_core = self.engine.engine_core   # AsyncMPClient, DPAsyncMPClient or AsyncInprocClient
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
    def from_engine_args(cls, **engine_args: Any) -> AsyncLLM:
        """AsyncLLM(model=..., max_num_seqs=..., ...) with the same arguments as `LLM(...)`."""
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
        if self._loop is not None and not (self._loop.is_closed()
                                           and getattr(self.engine_core, "follows_the_running_loop", False)):
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
        if self._loop is None or self._loop is asyncio.get_running_loop() or self._loop.is_closed():
            self._abort_now(ids, quiet=False)
        else:
            self._loop.call_soon_threadsafe(self._abort_now, ids, False)

    async def get_scheduler_stats(self) -> SchedulerStats:
        """The core's counters now (a utility call); from any loop or thread."""
        self._check_alive()
        if self._loop is None or self._loop is asyncio.get_running_loop() or self._loop.is_closed():
            if self._loop is not asyncio.get_running_loop():
                self._start_output_handler()
            return await self.engine_core.get_scheduler_stats_async()
        future = asyncio.run_coroutine_threadsafe(self.engine_core.get_scheduler_stats_async(), self._loop)
        return await asyncio.wrap_future(future)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the core (its process or thread); streams still open get EngineDeadError. Idempotent, from any
        thread."""
        self._stopped = True
        self._fail_all(EngineDeadError("the engine has been shut down"))
        handler, loop = self.output_handler, self._loop
        if handler is not None and not handler.done() and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(handler.cancel)
        self._input_executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_engine:
            self.engine.shutdown()
        elif self._given_client is not None:   # AsyncLLM(engine=...): stop the thread, hand the engine back
            self.engine_core.stop()
            self.engine.engine_core, self._given_client = self._given_client, None

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
            if timing is not None:    # counted as finished with reason "abort", as a finished request
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



__all__ = ["AsyncLLM", "EngineDeadError", "EngineStepError", "FinishedRequestStats", "InprocEngineCore",
           "IterationStats", "RequestOutputCollector", "StatLogger", "generate_stream", "merge_delta_outputs",
           "output_handler_step"]
