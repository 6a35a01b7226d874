"""How the front end reaches the engine core: in this process, or in a child process over ZMQ.

Mirrors vllm/v1/engine/core_client.py (`EngineCoreClient.make_client`, `InprocClient`, `MPClient`,
`SyncMPClient`, `AsyncMPClient`, the `BackgroundResources` finalizer, the death monitor
`MPClientEngineMonitor`).

    InprocClient     the `EngineCore` itself, called directly (`MINI_ENABLE_V1_MULTIPROCESSING=0`): what the
                     course's views and the tests that look inside the engine need
    SyncMPClient     `LLM`'s default: the core in a child process; a background thread reads its outputs
    AsyncMPClient    for asyncio callers (phase 13's `output_handler_step` / `generate_stream`): asyncio
                     sockets, outputs read by a task; same surface as `InprocEngineCore`
    AsyncInprocClient  `AsyncLLM`'s in process (mini's): the `EngineCore` stepped by one thread of this process,
                     `AsyncMPClient`'s surface (vLLM's `AsyncLLM` always runs its core as a process)

The switch (vLLM's `VLLM_ENABLE_V1_MULTIPROCESSING`): `MINI_ENABLE_V1_MULTIPROCESSING`, default 1, read when an
engine is built (`multiprocessing_enabled()`).

Starting the core's process (sockets, fork or spawn, the handshake, stopping it) is mini/engine/utils.py, as
vLLM keeps it in vllm/v1/engine/utils.py; `MPClient` calls it.

Death and shutdown: the client's output thread polls the output socket *and* the child's sentinel (a pipe that
becomes readable when the process ends, vLLM's `MPClientEngineMonitor`), so a child killed with SIGKILL fails
every waiter with `EngineDeadError` at once. `shutdown()` (also run by a `weakref.finalize` when the client is
garbage collected and at interpreter exit, vLLM's `BackgroundResources`) stops the child (SIGTERM, then
SIGKILL after 5 s), closes the sockets and removes their temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import shutil
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from mini.config import EngineConfig
from mini.core.request import RequestStatus
from mini.engine import EngineCoreOutput, EngineCoreRequest
from mini.engine.core import EngineCore
from mini.engine.exceptions import EngineDeadError, EngineInternalsError, EngineStepError
from mini.engine.utils import (  # the process start-up (vllm/v1/engine/utils.py)
    ENV_MULTIPROCESSING,
    POLL_MS,
    launch_core_engine,
    shutdown_core_process,
    wait_for_engine_startup,
)
from mini.metrics import message_trace
from mini.metrics.stats import SchedulerStats
from mini.serial_utils import (
    EngineCoreOutputs,
    EngineCoreOutputType,
    EngineCoreRequestType,
    decode_outputs,
    encode,
    scheduler_stats_from_wire,
)
from mini.system_utils import release_libgomp_threads

logger = logging.getLogger(__name__)

# In process (AsyncInprocClient): how long the idle engine thread sleeps on its command queue between checks
# for shutdown.
IDLE_POLL_S = 0.05


def multiprocessing_enabled() -> bool:
    """`MINI_ENABLE_V1_MULTIPROCESSING` (default 1): run the engine core in a child process."""
    value = os.environ.get(ENV_MULTIPROCESSING, "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{ENV_MULTIPROCESSING} must be 0 or 1, got {value!r}")


def internals_error(name: str) -> str:
    return (f"llm_engine.{name} lives in the engine-core process: this engine runs its core in a child "
            f"process (multiprocess mode). Set the environment variable {ENV_MULTIPROCESSING}=0 before "
            f"building the engine to keep the core, and {name}, in this process (the course's views and "
            f"other phases do; phase 14 explains the split).")


# ---------------------------------------------------------------------------- the interface
class EngineCoreClient:
    """What the front end calls (vLLM's `EngineCoreClient`); `make_client` picks the implementation."""

    @staticmethod
    def make_client(multiprocess_mode: bool, asyncio_mode: bool, config: EngineConfig,
                    while_starting: Callable[[], Any] | None = None
                    ) -> EngineCoreClient:
        """`while_starting` (multiprocess only): work for the front end to do while the child starts, its result
        kept as the client's `started_alongside` (LLMEngine loads its tokenizer there)."""
        if asyncio_mode:
            if not multiprocess_mode:   # AsyncLLM in process: the core steps on a thread of this process
                return AsyncInprocClient(config)
            return AsyncMPClient(config, while_starting=while_starting)
        if multiprocess_mode:
            # `LLM` / `LLMEngine`: the front end waits while the core steps, so the core takes every thread.
            return SyncMPClient(config, front_end_threads=0, while_starting=while_starting)
        return InprocClient(config)

    is_multiprocess = False
    startup: dict[str, Any]
    started_alongside: Any = None   # what `while_starting` returned (multiprocess), else None

    def local_core(self, name: str) -> EngineCore:
        """The `EngineCore` in this process, for the course's views and the tests that look inside; a client
        whose core is in another process raises `EngineInternalsError` naming `name` and the switch."""
        raise EngineInternalsError(internals_error(name))

    def has_work(self) -> bool:
        """Work only the core can see (an in-process core's steps still in flight); the front end's view of its
        requests is its output processor's. A core in another process finishes its own: False."""
        return False

    def add_request(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    def abort_requests(self, request_ids: list[str]) -> None:
        raise NotImplementedError

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        raise NotImplementedError

    def get_output(self, timeout: float | None = None) -> EngineCoreOutputs:
        """The next step's outputs; a core in another process returns an empty one after `timeout` seconds."""
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


class InprocClient(EngineCoreClient):
    """The engine core in this process (vLLM's `InprocClient`): `get_output` runs one step."""

    def __init__(self, config: EngineConfig) -> None:
        self.engine_core = EngineCore(config)
        self.startup = self.engine_core.startup_info()
        self.started_alongside = self.engine_core.tokenizer   # one tokenizer for the front end and the core

    def local_core(self, name: str) -> EngineCore:
        return self.engine_core

    def has_work(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        self.engine_core.finish_requests(request_ids, status)

    def get_output(self, timeout: float | None = None) -> EngineCoreOutputs:
        return EngineCoreOutputs(outputs=self.engine_core.step())   # one step, inline: nothing to wait for

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.engine_core.get_num_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def get_scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats.from_scheduler(self.engine_core.scheduler)

    def call_utility(self, method: str, *args: Any) -> Any:
        from mini.engine.core_proc import UTILITY_METHODS

        return UTILITY_METHODS[method](_InprocView(self.engine_core), *args)

    def shutdown(self) -> None:
        self.engine_core.shutdown()


@dataclass
class _InprocView:
    engine_core: EngineCore

    def _scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats.from_scheduler(self.engine_core.scheduler)


class AsyncOutputQueueMixin:
    """The asyncio surface both asyncio clients share (`AsyncInprocClient`, `AsyncMPClient`): requests in, and each
    step's outputs out of an `asyncio.Queue` that the client's producer (the engine thread, or the socket reader)
    fills on the caller's loop, bound by `_ensure_started` on first use. An exception in the queue (the core died)
    stays there, so every later reader sees it too."""

    _outputs_queue: asyncio.Queue | None
    failed_requests: dict[str, str]
    latest_scheduler_stats: SchedulerStats | None

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_started()
        self.add_request(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._ensure_started()
        self.abort_requests(list(request_ids))

    async def outputs_async(self) -> EngineCoreOutputs:
        self._ensure_started()
        item = await self._outputs_queue.get()
        if isinstance(item, BaseException):
            self._outputs_queue.put_nowait(item)
            raise item
        if item.scheduler_stats is not None:
            self.latest_scheduler_stats = item.scheduler_stats
        return item

    async def get_output_async(self) -> list[EngineCoreOutput]:
        """The next step's outputs; a step that failed raises EngineStepError for its requests."""
        return step_outputs(await self.outputs_async(), self.failed_requests)


class AsyncInprocClient(AsyncOutputQueueMixin, EngineCoreClient):
    """The engine core in this process for asyncio callers: `AsyncLLM`'s client with
    `MINI_ENABLE_V1_MULTIPROCESSING=0` (mini's; vLLM's `AsyncLLM` always runs its core as a process).

    The core steps on **one background thread** (`mini-engine-loop`), the part vLLM's engine-core process plays:
    a step is a blocking forward pass, and on the event loop it would freeze every stream and HTTP connection
    for its duration; PyTorch releases the GIL inside its kernels, so the loop keeps serving meanwhile. The thread
    runs `EngineCoreProc`'s busy loop (mini/engine/core_proc.py) without the sockets: commands (add, abort,
    utility calls) arrive on a queue and run between two steps, so the core is touched by that thread alone;
    each step's `EngineCoreOutputs` (with its `SchedulerStats`) reaches the event loop through
    `call_soon_threadsafe`. A request the core refuses, or a step that raises, comes back as `failed_requests`
    (the core aborted them and goes on), as from the child process. The surface is `AsyncMPClient`'s.

    It follows the running loop: once the loop it served is closed, the next call binds the new one (a notebook
    or a test that runs one `asyncio.run` after another). The building thread gives its OpenMP pool back before
    the thread starts, and the thread gives its own back whenever the core runs out of requests
    (mini/system_utils.py). `engine_core=` wraps an existing core (`AsyncLLM(engine=an in-process LLMEngine)`).
    """

    follows_the_running_loop = True

    def __init__(self, config: EngineConfig | None = None, *,
                 engine_core: EngineCore | None = None) -> None:
        self.engine_core = engine_core if engine_core is not None else EngineCore(config)
        self.startup = self.engine_core.startup_info()
        self.started_alongside = self.engine_core.tokenizer   # one tokenizer for the front end and the core
        self.latest_scheduler_stats: SchedulerStats | None = None
        self.failed_requests: dict[str, str] = {}
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs_queue: asyncio.Queue | None = None
        self._undelivered: list[Any] = []      # produced while no open loop was bound
        self._stop = threading.Event()
        self._dead_message: str | None = None
        self._thread = threading.Thread(target=self._run_busy_loop, name="mini-engine-loop", daemon=True)
        release_libgomp_threads()   # the loop thread runs the forwards now (mini/system_utils.py)
        self._thread.start()

    def local_core(self, name: str) -> EngineCore:
        return self.engine_core

    # ------------------------------------------------------------------ the event loop's side
    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        with self._lock:
            if self._loop is not None and not self._loop.is_closed():
                raise RuntimeError("an AsyncInprocClient serves one open event loop at a time")
            self._loop, self._outputs_queue = loop, asyncio.Queue()
            undelivered, self._undelivered = self._undelivered, []
        for item in undelivered:
            self._outputs_queue.put_nowait(item)

    def _deliver(self, item: Any) -> None:
        """From the engine thread: one EngineCoreOutputs (or the error that ended the loop) to the event loop."""
        with self._lock:
            loop, outputs_queue = self._loop, self._outputs_queue
            if loop is None or loop.is_closed():
                self._undelivered.append(item)
                return
            try:
                loop.call_soon_threadsafe(outputs_queue.put_nowait, item)
            except RuntimeError:   # the loop closed meanwhile
                self._undelivered.append(item)

    def _check_alive(self) -> None:
        if self._dead_message is not None:
            raise EngineDeadError(self._dead_message)
        if self._stop.is_set():
            raise EngineDeadError("the engine core has been shut down")

    def is_alive(self) -> bool:
        return self._dead_message is None and not self._stop.is_set() and self._thread.is_alive()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self._commands.put(("add", request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        if request_ids and not self._stop.is_set():
            self._commands.put(("finish", (list(request_ids), status)))

    def _call(self, method: str, *args: Any) -> Future:
        """Run a utility (mini/engine/core_proc.py `UTILITY_METHODS`) on the engine thread between two steps."""
        self._check_alive()
        future: Future = Future()
        self._commands.put(("utility", (method, args, future)))
        if not self._thread.is_alive():   # ended between the check and the put
            self._refuse_queued(EngineDeadError("the engine core has been shut down"))
        return future

    def call_utility(self, method: str, *args: Any) -> Any:
        return self._call(method, *args).result()

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        return await asyncio.wrap_future(self._call(method, *args))

    def get_scheduler_stats(self) -> SchedulerStats:
        return self.call_utility("get_scheduler_stats")

    async def get_scheduler_stats_async(self) -> SchedulerStats:
        return await self.call_utility_async("get_scheduler_stats")

    def reset_prefix_cache(self) -> bool:
        return bool(self.call_utility("reset_prefix_cache"))

    async def reset_prefix_cache_async(self) -> bool:
        return bool(await self.call_utility_async("reset_prefix_cache"))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread (the core stays usable: `AsyncLLM(engine=...)` hands it back). Idempotent."""
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def shutdown(self) -> None:
        self.stop()
        if not self._thread.is_alive():
            self.engine_core.shutdown()

    # ------------------------------------------------------------------ the engine thread
    def _run_busy_loop(self) -> None:
        """Until stopped: run the queued commands (blocking while idle), then one step (`run_busy_loop`)."""
        core = self.engine_core
        holds_pool = False   # whether this thread may hold an OpenMP pool from its last steps
        try:
            while not self._stop.is_set():
                busy = core.has_unfinished_requests()
                if not busy and holds_pool:   # idle: give the pool back to whoever computes next (system_utils)
                    release_libgomp_threads()
                    holds_pool = False
                self._drain_commands(block=not busy)
                if self._stop.is_set():
                    break
                if core.has_unfinished_requests():
                    self._step()
                    holds_pool = True
            if holds_pool:   # stopped: the pool's workers are joined now, not whenever the runtime gets to them
                release_libgomp_threads()
        except BaseException as error:  # a bug in the loop itself: fail everyone, refuse new requests
            logger.exception("the engine loop died")
            self._dead_message = f"the engine loop died: {error!r}"
            self._deliver(EngineDeadError(self._dead_message))
        finally:
            self._refuse_queued(EngineDeadError(self._dead_message or "the engine core has been shut down"))

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
        core = self.engine_core
        if kind == "add":
            try:
                core.add_request(payload)
            except Exception as error:  # noqa: BLE001  (only this request fails; the core goes on)
                logger.exception("engine core refused request %s", payload.request_id)
                self._deliver(EngineCoreOutputs(
                    failed_requests={payload.request_id: f"the engine core refused the request: {error!r}"}))
        elif kind == "finish":
            request_ids, status = payload
            core.finish_requests(request_ids, status)
        elif kind == "utility":
            from mini.engine.core_proc import UTILITY_METHODS

            method, args, future = payload
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(UTILITY_METHODS[method](_InprocView(core), *args))
                except Exception as error:  # noqa: BLE001  (the caller gets the error, the core carries on)
                    future.set_exception(error)

    def _step(self) -> None:
        core = self.engine_core
        try:
            outputs = core.step()
        except Exception as error:
            logger.exception("engine step failed; aborting the requests in flight")
            failed = list(core.scheduler.requests)
            core.abort_requests(failed)   # if this raises too, the loop dies (and says why)
            self._deliver(EngineCoreOutputs(failed_requests=dict.fromkeys(failed, f"{error!r}"),
                                            scheduler_stats=SchedulerStats.from_scheduler(core.scheduler)))
            return
        if outputs:
            self._deliver(EngineCoreOutputs(outputs=outputs,
                                            scheduler_stats=SchedulerStats.from_scheduler(core.scheduler)))

    def _refuse_queued(self, error: BaseException) -> None:
        while True:  # utility calls still queued: answer them with the error
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "utility" and not payload[-1].done():
                payload[-1].set_exception(error)


# ---------------------------------------------------------------------------- the child process
@dataclass
class BackgroundResources:
    """What a multiprocess client owns, closed once by `close` (vLLM's `BackgroundResources`).

    Kept apart from the client so that the client's threads and finalizer never hold the client itself:
    dropping the last reference to an `LLM` garbage-collects the client, which runs `close`."""

    proc: Any = None
    socket_dir: str | None = None
    context: zmq.Context | None = None
    input_socket: zmq.Socket | None = None
    output_socket: zmq.Socket | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    dead_message: str | None = None
    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        shutdown_core_process(self.proc)
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(1.0)
        for socket in (self.input_socket, self.output_socket):
            if socket is not None:
                socket.close(linger=0)
        if self.context is not None:
            self.context.term()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


class MPClient(EngineCoreClient):
    """Start the engine-core process, bind its sockets, wait for its handshake (vLLM's `MPClient`)."""

    is_multiprocess = True

    def __init__(self, config: EngineConfig, asyncio_mode: bool,
                 front_end_threads: int = 1, while_starting: Callable[[], Any] | None = None) -> None:
        self.resources = resources = BackgroundResources()
        self._finalizer = weakref.finalize(self, resources.close)
        launch_core_engine(resources, config, front_end_threads)   # sockets bound, process built
        try:
            resources.proc.start()
            # Started first, then this process's own work, then the wait: the child loads the model while the
            # front end does this (vLLM loads the tokenizer before it starts the core; the same work, in series).
            self.started_alongside = while_starting() if while_starting is not None else None
            self.startup = self._wait_for_handshake()
        except BaseException:
            self.shutdown()
            raise
        self._input_lock = threading.Lock()
        self._call_ids = itertools.count()
        self.latest_scheduler_stats: SchedulerStats | None = None

    def _wait_for_handshake(self) -> dict[str, Any]:
        return wait_for_engine_startup(self.resources)

    # ------------------------------------------------------------------ sending
    def _send(self, request_type: EngineCoreRequestType, payload: Any) -> None:
        self._check_alive()
        data = encode(payload)
        if message_trace.ON:
            message_trace.record("front end", "send", request_type.name, nbytes=len(data),
                                 request_ids=message_trace.request_ids_of(payload))
        with self._input_lock:
            self.resources.input_socket.send_multipart([request_type.value, data], copy=False)

    def _check_alive(self) -> None:
        resources = self.resources
        if resources.dead_message is not None:
            raise EngineDeadError(resources.dead_message)
        if resources.closed:
            raise EngineDeadError("the engine core has been shut down")

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(EngineCoreRequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(EngineCoreRequestType.ABORT, [list(request_ids), RequestStatus.FINISHED_ABORTED.name])

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        if request_ids:
            self._send(EngineCoreRequestType.ABORT, [list(request_ids), status.name])

    @property
    def pid(self) -> int:
        return self.resources.proc.pid

    @property
    def socket_dir(self) -> str | None:
        return self.resources.socket_dir

    def is_alive(self) -> bool:
        """False once the core is known dead or shut down, or its process has exited: the exit is read here
        too, so a core that dies before any request started the monitor thread is seen (the server's /health
        and its watchdog ask this)."""
        resources = self.resources
        proc = resources.proc
        return (resources.dead_message is None and not resources.closed
                and (proc is None or proc.exitcode is None))

    def shutdown(self) -> None:
        self._finalizer()


def step_outputs(outputs: EngineCoreOutputs, failed_requests: dict[str, str]) -> list[EngineCoreOutput]:
    """A step's `EngineCoreOutput`s; a step that failed records its requests in `failed_requests` and raises
    EngineStepError (the async clients' `get_output_async`)."""
    if outputs.failed_requests:
        failed_requests.update(outputs.failed_requests)
        raise EngineStepError(next(iter(outputs.failed_requests.values())))
    return outputs.outputs


def _dead_message(resources: BackgroundResources, why: str) -> str:
    proc = resources.proc
    if proc is not None:
        proc.join(0.5)     # its sentinel fires as it exits; reap it to read the exit code
    code = proc.exitcode if proc is not None else None
    return (f"the engine core (pid {proc.pid if proc is not None else '?'}) died: {why}"
            + (f" (exit code {code})" if code is not None else "")
            + ". Its requests are lost; build a new engine.")


# ---------------------------------------------------------------------------- sync
class SyncMPClient(MPClient):
    """The engine core in a child process, for `LLM` / `LLMEngine` (vLLM's `SyncMPClient`).

    A background thread reads the output socket: step outputs go to `outputs_queue`, utility answers to
    their caller's future, and the child's end (its sentinel becoming readable) to both as EngineDeadError.
    """

    def __init__(self, config: EngineConfig, front_end_threads: int = 1,
                 while_starting: Callable[[], Any] | None = None) -> None:
        super().__init__(config, asyncio_mode=False, front_end_threads=front_end_threads,
                         while_starting=while_starting)
        self.outputs_queue: queue.Queue[EngineCoreOutputs | BaseException] = queue.Queue()
        self._utility_futures: dict[int, Future] = {}
        thread = threading.Thread(target=_read_outputs_sync,
                                  args=(self.resources, self.outputs_queue, self._utility_futures),
                                  name="mini-engine-core-output", daemon=True)
        self.resources.threads.append(thread)
        thread.start()

    def get_output(self, timeout: float | None = None) -> EngineCoreOutputs:
        """The next EngineCoreOutputs; an empty one after `timeout` seconds; EngineDeadError once dead."""
        try:
            item = self.outputs_queue.get(timeout=timeout)
        except queue.Empty:
            self._check_alive()
            return EngineCoreOutputs()
        if isinstance(item, BaseException):
            self.outputs_queue.put(item)   # every later call fails the same way
            raise item
        if item.scheduler_stats is not None:
            self.latest_scheduler_stats = item.scheduler_stats
        return item

    def call_utility(self, method: str, *args: Any, timeout: float | None = 60.0) -> Any:
        """Run a named utility in the core between two steps and wait for its result (vLLM: `call_utility`)."""
        call_id = next(self._call_ids)
        future: Future = Future()
        self._utility_futures[call_id] = future
        try:
            self._send(EngineCoreRequestType.UTILITY, [call_id, method, list(args)])
            return future.result(timeout)
        finally:
            self._utility_futures.pop(call_id, None)

    def reset_prefix_cache(self) -> bool:
        return bool(self.call_utility("reset_prefix_cache"))

    def get_scheduler_stats(self) -> SchedulerStats:
        return scheduler_stats_from_wire(self.call_utility("get_scheduler_stats"))


def _read_outputs_sync(resources: BackgroundResources, outputs_queue: queue.Queue,
                       utility_futures: dict[int, Future]) -> None:
    """The client's output thread: socket -> queue / futures; the child's death -> EngineDeadError."""
    socket, sentinel = resources.output_socket, resources.proc.sentinel
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(sentinel, zmq.POLLIN)
    try:
        while not resources.stop.is_set():
            events = dict(poller.poll(POLL_MS))
            if socket in events:
                if not _handle_output_frame(resources, *socket.recv_multipart(), outputs_queue, utility_futures):
                    return
                continue
            if sentinel in events and not resources.stop.is_set():
                _mark_dead(resources, outputs_queue, utility_futures, "its process ended unexpectedly")
                return
    except Exception as error:  # noqa: BLE001  (e.g. the sockets closed under us at shutdown)
        if not resources.stop.is_set():
            _mark_dead(resources, outputs_queue, utility_futures, f"reading its outputs failed: {error!r}")


def _handle_output_frame(resources: BackgroundResources, kind: bytes, data: bytes, outputs_queue: Any,
                         utility_futures: dict[int, Any]) -> bool:
    """One message from the core, for the sync output thread and the async reader alike: a step's outputs to
    the queue, a utility call's result to its future, DEAD to every waiter -> False once the core is dead."""
    if EngineCoreOutputType(kind) is EngineCoreOutputType.DEAD:
        _mark_dead(resources, outputs_queue, utility_futures, f"it hit an unrecoverable error:\n{data.decode()}")
        return False
    outputs = decode_outputs(data)
    if message_trace.ON:
        message_trace.record("front end", "recv", "OUTPUTS", nbytes=len(data),
                             request_ids=message_trace.request_ids_of(outputs))
    if outputs.utility_output is not None:
        _resolve_utility(utility_futures, outputs.utility_output)
    else:
        outputs_queue.put_nowait(outputs)   # queue.Queue and asyncio.Queue both have it, and neither is bounded
    return True


def _mark_dead(resources: BackgroundResources, outputs_queue: Any, utility_futures: dict[int, Future],
               why: str) -> None:
    resources.dead_message = _dead_message(resources, why)
    logger.error("%s", resources.dead_message)
    error = EngineDeadError(resources.dead_message)
    outputs_queue.put_nowait(error)   # queue.Queue or asyncio.Queue
    for future in list(utility_futures.values()):
        if not future.done():
            future.set_exception(error)


def _resolve_utility(utility_futures: dict[int, Any], output: Any) -> None:
    future = utility_futures.get(output.call_id)
    if future is None or future.done():
        return
    if output.failure_message is not None:
        future.set_exception(RuntimeError(f"engine-core utility call failed: {output.failure_message}"))
    else:
        future.set_result(output.result)


# ---------------------------------------------------------------------------- async
class AsyncMPClient(AsyncOutputQueueMixin, MPClient):
    """The engine core in a child process, for asyncio callers (vLLM's `AsyncMPClient`).

    Outputs are read by an asyncio task on the caller's loop (started on first use); the child's death is
    watched by a thread on its sentinel and reported to the loop. `get_output_async` returns the next step's
    `EngineCoreOutput`s as a list (`outputs_async` the whole `EngineCoreOutputs`): the surface phase 13's
    `output_handler_step` and `generate_stream` use, as `InprocEngineCore` offers in process.
    """

    def __init__(self, config: EngineConfig,
                 while_starting: Callable[[], Any] | None = None) -> None:
        super().__init__(config, asyncio_mode=True, while_starting=while_starting)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs_queue: asyncio.Queue | None = None
        self._utility_futures: dict[int, asyncio.Future] = {}
        self.failed_requests: dict[str, str] = {}

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError("an AsyncMPClient serves one event loop")
        self._loop = loop
        self._outputs_queue = asyncio.Queue()
        resources = self.resources
        # The output socket is read on this loop through an asyncio shadow of the same socket (no re-bind: a
        # core forked later holds a copy of this socket's connection, and a re-bind would strand the core's
        # outputs on it). The sync socket stays the owner, closed by `resources.close`.
        self._async_output_socket = zmq.asyncio.Socket.from_socket(resources.output_socket)
        self._reader = loop.create_task(_read_outputs_async(resources, self._async_output_socket,
                                                            self._outputs_queue, self._utility_futures))
        watcher = threading.Thread(target=_watch_child, args=(resources, loop, self._outputs_queue,
                                                              self._utility_futures),
                                   name="mini-engine-core-monitor", daemon=True)
        resources.threads.append(watcher)
        watcher.start()

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        self._ensure_started()
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self._utility_futures[call_id] = future
        try:
            self._send(EngineCoreRequestType.UTILITY, [call_id, method, list(args)])
            return await future
        finally:
            self._utility_futures.pop(call_id, None)

    async def reset_prefix_cache_async(self) -> bool:
        return bool(await self.call_utility_async("reset_prefix_cache"))

    async def get_scheduler_stats_async(self) -> SchedulerStats:
        return scheduler_stats_from_wire(await self.call_utility_async("get_scheduler_stats"))

    def shutdown(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None and not reader.done():
            reader.cancel()
        super().shutdown()


async def _read_outputs_async(resources: BackgroundResources, socket: zmq.asyncio.Socket,
                              outputs_queue: asyncio.Queue, utility_futures: dict[int, asyncio.Future]) -> None:
    while not resources.stop.is_set():
        if not _handle_output_frame(resources, *await socket.recv_multipart(), outputs_queue, utility_futures):
            return


def _watch_child(resources: BackgroundResources, loop: asyncio.AbstractEventLoop, outputs_queue: asyncio.Queue,
                 utility_futures: dict[int, asyncio.Future]) -> None:
    """Wait on the child's sentinel; when it ends unexpectedly, fail the loop's waiters (vLLM's monitor)."""
    from multiprocessing import connection

    while not resources.stop.is_set():
        if connection.wait([resources.proc.sentinel], timeout=POLL_MS / 1000):
            break
    if resources.stop.is_set() or resources.dead_message is not None:
        return
    with contextlib.suppress(RuntimeError):   # the loop is closed: nobody is waiting
        loop.call_soon_threadsafe(_mark_dead, resources, outputs_queue, utility_futures,
                                  "its process ended unexpectedly")
