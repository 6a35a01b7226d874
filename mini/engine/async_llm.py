"""`AsyncLLM`: one engine, many callers streaming from it; this file holds its in-process design.

Mirrors vllm/v1/engine/async_llm.py (AsyncLLM.generate / abort / shutdown, the per-request
`RequestOutputCollector` of vllm/v1/engine/output_processor.py) and the busy loop of
vllm/v1/engine/core.py (EngineCoreProc.run_busy_loop).

Two designs behind one constructor (`AsyncLLM(config)` picks by `MINI_ENABLE_V1_MULTIPROCESSING`):
  * multiprocess (the default): vLLM's own, in mini/engine/async_llm_mp.py (`MPAsyncLLM`): the front end
    on the event loop, the core in a child process behind an `AsyncMPClient` (`DPAsyncMPClient` with
    data parallelism), one output-handler task built from `output_handler_step` / `generate_stream` below.
  * in process (`=0`, or `AsyncLLM(engine=an LLMEngine)`): this class, described next. vLLM has no such
    mode for its AsyncLLM; mini keeps it because the course's views and tests look inside the engine.

In process, the engine loop runs on **one background thread**, not an asyncio task: `LLMEngine.step()`
is a blocking forward pass (tens of ms on a CPU); inside an asyncio task it would freeze the event
loop, and with it every HTTP connection and every token stream, for the whole step. On its own
thread it plays the part of vLLM's engine-core process; PyTorch releases the GIL inside its kernels,
so the event loop keeps serving while the model runs.

The two sides meet at two places only:
  * a command queue (add / abort), drained by the engine thread between steps. The engine object is
    touched by that thread alone, so it needs no lock; `add` returns a future, so a bad request's
    `ValueError` reaches its caller (and only its caller) before it starts iterating.
  * one `RequestOutputCollector` per request, filled from the engine thread with
    `loop.call_soon_threadsafe`. It holds at most ONE pending output: a slow reader gets the new deltas
    merged into it (DELTA) or, sample by sample, the newer snapshot replacing it (CUMULATIVE /
    FINAL_ONLY), as vLLM's collector does. So nothing grows without bound: back-pressure is the
    scheduler's, which runs at most `max_num_seqs` requests and `max_num_batched_tokens` tokens a step
    and keeps the rest waiting.

A caller that stops iterating (closes the generator) or is cancelled (a client disconnect cancels the
server's task) aborts its request: the abort is queued at once and the engine thread runs it before
its next step, which frees the request's KV blocks. An exception while adding a request goes to that
caller only; an exception inside `step()` cannot be pinned on one request of the batch, so every request
in flight gets it (and is aborted, freeing its blocks) and the loop carries on with new requests.

`AsyncLLM(engine=...)` with an engine whose core is a child process (`SyncMPClient`) also works: the thread
then does the front end's work only and `step()` waits for the core's outputs; the child's death ends the
loop with `EngineDeadError` for every caller.

Statistics: after each step the loop hands `(SchedulerStats, IterationStats)` to each stat logger
(vllm/v1/metrics/loggers.py): counters only (`LLMEngine.get_scheduler_stats()`, no block table is copied;
a teaching view that wants the pool attaches a step observer to the engine instead); `IterationStats` carries the
step's token counts and the per-request latencies measured when outputs leave the engine (time to first token,
inter-token, end-to-end). A FINAL_ONLY request produces one output only, so its first-token time is its end-to-end
time; the OpenAI server streams internally with DELTA for that reason.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

from mini.config import EngineConfig, engine_config_from_args
from mini.engine.async_llm_mp import MPAsyncLLM
from mini.engine.core_client import multiprocessing_enabled
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
from mini.system_utils import release_libgomp_threads

logger = logging.getLogger(__name__)

# How long the idle engine thread sleeps on the command queue before checking for shutdown.
IDLE_POLL_S = 0.05


# EngineDeadError, EngineStepError: mini/engine/exceptions.py (vllm/v1/engine/exceptions.py), re-exported here.


# ---------------------------------------------------------------------------- vLLM's front-end shape
# vLLM's AsyncLLM splits each step in two: the engine core (another process) schedules, runs the model and
# returns `EngineCoreOutput`s (token ids); the front end's `output_handler` task turns them into
# `RequestOutput`s with the output processor, pushes each into its request's collector, and tells the core
# to abort the requests a stop string finished (the core cannot see text). `generate()` aborts a request
# whose consumer went away. In multiprocess mode `AsyncLLM` runs exactly this over an `AsyncMPClient`
# (mini/engine/async_llm_mp.py, plus statistics and n > 1); the in-process `AsyncLLM` below does the same work
# on its engine thread (`LLMEngine.step` processes the outputs and finishes stop-string requests;
# `_step_once` routes them; `generate`'s `finally` queues the abort). The three pieces below are that split
# written as vLLM writes it; the course (phase 13) has the learner write the first two.
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
        self.output_processor = OutputProcessor(engine.tokenizer, engine.choices)
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
class AsyncLLM(abc.ABC):  # noqa: B024 - an ABC for `AsyncLLM.register(MPAsyncLLM)`: isinstance holds for both
    """`generate()` is an async stream per request. `AsyncLLM(config)` in multiprocess mode (the default) is an
    `MPAsyncLLM` (mini/engine/async_llm_mp.py: AsyncMPClient + output-handler task, vLLM's design); in process
    (`MINI_ENABLE_V1_MULTIPROCESSING=0`, or `AsyncLLM(engine=an LLMEngine)`) an `LLMEngine` driven by a
    background thread (this class). That thread runs the forwards: the building thread gives its OpenMP pool back
    before it starts, and the loop gives its own back whenever it runs out of requests (mini/system_utils.py)."""

    def __new__(cls, config: EngineConfig | None = None, *, engine: LLMEngine | None = None,
                stat_loggers: list[StatLogger] | None = None) -> Any:
        if cls is AsyncLLM and engine is None and multiprocessing_enabled():
            # vLLM's design, built whole here (it is registered as an AsyncLLM, not a subclass of this
            # thread design, so Python does not run this class' __init__ on it).
            return MPAsyncLLM(config, stat_loggers=stat_loggers)
        return super().__new__(cls)

    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None,
                 stat_loggers: list[StatLogger] | None = None) -> None:
        self._owns_engine = engine is None
        if engine is None:
            engine = LLMEngine(config or EngineConfig())
        self.engine = engine
        self.config = engine.config
        self.stat_loggers: list[StatLogger] = list(stat_loggers or [])
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._collectors: dict[str, RequestOutputCollector] = {}   # engine thread only
        self._timings: dict[str, RequestTiming] = {}              # engine thread only
        self._aborting: dict[str, tuple[RequestOutputCollector, RequestTiming | None]] = {}
        self._stop = threading.Event()
        self._dead_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run_engine_loop, name="mini-engine-loop", daemon=True)
        release_libgomp_threads()   # the loop thread runs the forwards now (mini/system_utils.py)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, **engine_args: Any) -> AsyncLLM:
        """AsyncLLM(model=..., max_num_seqs=..., ...) with the same arguments as `LLM(...)`."""
        return cls(engine_config_from_args(**engine_args))

    # ------------------------------------------------------------------ the public surface
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    @property
    def errored(self) -> bool:
        return self._dead_error is not None

    async def generate(self, prompt: Any, sampling_params: SamplingParams | None, request_id: str,
                       priority: int = 0, lora_request: Any = None) -> AsyncGenerator[RequestOutput, None]:
        """Stream the request's outputs; the last has `finished=True`.

        Raises ValueError/TypeError (bad input, nothing was added) before the first output. Closing the
        generator early or cancelling the task that iterates it aborts the request.
        """
        self._check_alive()
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        collector = RequestOutputCollector(params.output_kind, asyncio.get_running_loop())
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        finished = False
        added = False
        try:
            self._commands.put(("add", (request_id, prompt, params, priority, collector, future, lora_request)))
            if not self._thread.is_alive():  # shut down between the check above and the put
                self._refuse_queued(EngineDeadError("the engine loop has been shut down"))
            await asyncio.wrap_future(future)
            added = True
            while True:
                output = await collector.get()
                finished = output.finished
                yield output
                if finished:
                    return
        finally:
            if not finished and (added or not future.done()):
                self._commands.put(("abort", [request_id]))

    async def abort(self, request_id: str | list[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their streams end with finish_reason 'abort'."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._commands.put(("abort", ids))

    async def get_scheduler_stats(self) -> SchedulerStats:
        """The scheduler's counters (`SchedulerStats`), taken on the engine thread between two steps."""
        self._check_alive()
        future: concurrent.futures.Future[SchedulerStats] = concurrent.futures.Future()
        self._commands.put(("stats", future))
        return await asyncio.wrap_future(future)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; requests still in flight get EngineDeadError. Idempotent."""
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        if self._owns_engine and not self._thread.is_alive():
            self.engine.shutdown()     # multiprocess mode: stop the engine-core process now

    def _check_alive(self) -> None:
        if self._dead_error is not None:
            raise EngineDeadError(f"the engine loop has stopped: {self._dead_error}")
        if self._stop.is_set():
            raise EngineDeadError("the engine loop has been shut down")

    # ------------------------------------------------------------------ the engine thread
    def _run_engine_loop(self) -> None:
        holds_pool = False   # whether this thread may hold an OpenMP pool from its last steps
        try:
            while not self._stop.is_set():
                busy = self.engine.has_unfinished_requests()
                if not busy and holds_pool:   # idle: give the pool back to whoever computes next (system_utils)
                    release_libgomp_threads()
                    holds_pool = False
                self._drain_commands(block=not busy)
                if self._stop.is_set():
                    break
                if self.engine.has_unfinished_requests():
                    self._step_once()
                    holds_pool = True
        except BaseException as error:  # a bug in the loop itself: fail everyone, refuse new requests
            logger.exception("the engine loop died")
            self._dead_error = error
        finally:
            error = self._dead_error or EngineDeadError("the engine was shut down")
            self._fail_in_flight(error)
            self._refuse_queued(error)

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_POLL_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle_command(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle_command(self, kind: str, payload: Any) -> None:
        if kind == "add":
            request_id, prompt, params, priority, collector, future, lora_request = payload
            if future.cancelled():
                return
            try:
                self.engine.add_request(request_id, prompt, params, priority=priority, lora_request=lora_request)
            except Exception as error:  # noqa: BLE001  (bad input, or any failure: only this caller hears it)
                future.set_exception(error)
                return
            self._collectors[request_id] = collector
            self._timings[request_id] = RequestTiming(time.monotonic(), params.output_kind)
            future.set_result(None)
        elif kind == "abort":
            live = [rid for rid in payload if rid in self._collectors]
            if live:
                self.engine.abort_request(live)
                # The final "abort" outputs come out of the next step(); by then a new request may reuse
                # the id, so they are routed by this table, not by `_collectors`.
                for rid in live:
                    self._aborting[rid] = (self._collectors.pop(rid), self._timings.pop(rid, None))
        elif kind == "stats":
            payload.set_result(self.engine.get_scheduler_stats())

    def _step_once(self) -> None:
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise                      # the engine-core process is gone: the loop ends, everyone hears it
        except Exception as error:
            logger.exception("engine step failed; aborting the %d requests in flight", len(self._collectors))
            failed = list(self._collectors)
            self._fail_in_flight(EngineStepError(f"the engine step failed: {error!r}"))
            self.engine.abort_request(failed)   # if this raises too, the loop dies (and says why)
            return
        now = time.monotonic()
        iteration = IterationStats()
        for output in outputs:
            rid = output.request_id
            if output.finished and rid in self._aborting:
                collector, timing = self._aborting.pop(rid)
            else:
                collector, timing = self._collectors.get(rid), self._timings.get(rid)
                if output.finished:
                    self._collectors.pop(rid, None)
                    self._timings.pop(rid, None)
            if timing is not None:
                self._record(output, timing, now, iteration)
            if collector is not None:
                collector.put_threadsafe(output)
        if self.stat_loggers:
            scheduler_stats = self.engine.step_scheduler_stats()   # multiprocess: sent with the step's outputs
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger(scheduler_stats, iteration)
                except Exception:
                    logger.exception("stat logger %r failed", stat_logger)

    @staticmethod
    def _record(output: RequestOutput, timing: RequestTiming, now: float, iteration: IterationStats) -> None:
        record_output(output, timing, now, iteration)

    def _fail_in_flight(self, error: BaseException) -> None:
        collectors, self._collectors = self._collectors, {}
        self._timings.clear()
        collectors.update({rid: collector for rid, (collector, _) in self._aborting.items()})
        self._aborting.clear()
        for collector in collectors.values():
            collector.put_threadsafe(error)

    def _refuse_queued(self, error: BaseException) -> None:
        while True:  # adds still queued: refuse them; stats requests: answer them
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and not payload[-1].done():
                payload[-1].set_exception(EngineDeadError(str(error)))
            elif kind == "stats" and not payload.done():
                payload.set_exception(EngineDeadError(str(error)))


AsyncLLM.register(MPAsyncLLM)   # isinstance(AsyncLLM(config), AsyncLLM) in either mode

__all__ = ["AsyncLLM", "EngineDeadError", "EngineStepError", "FinishedRequestStats", "InprocEngineCore",
           "IterationStats", "RequestOutputCollector", "StatLogger", "generate_stream", "merge_delta_outputs",
           "output_handler_step"]
