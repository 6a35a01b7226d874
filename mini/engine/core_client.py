"""How the front end reaches the engine core: in this process, or in a child process over ZMQ.

Mirrors vllm/v1/engine/core_client.py (`EngineCoreClient.make_client`, `InprocClient`, `MPClient`,
`SyncMPClient`, `AsyncMPClient`, the `BackgroundResources` finalizer) and vllm/v1/engine/utils.py (starting
the engine-core process, `CoreEngineProcManager`, its death monitor).

    InprocClient     the `EngineCore` itself, called directly (`MINI_ENABLE_V1_MULTIPROCESSING=0`): what the
                     course's views and the tests that look inside the engine need
    SyncMPClient     `LLM`'s default: the core in a child process; a background thread reads its outputs
    AsyncMPClient    for asyncio callers (phase 13's `output_handler_step` / `generate_stream`): asyncio
                     sockets, outputs read by a task; same surface as `InprocEngineCore`

The switch (vLLM's `VLLM_ENABLE_V1_MULTIPROCESSING`): `MINI_ENABLE_V1_MULTIPROCESSING`, default 1, read when an
engine is built (`multiprocessing_enabled()`).

Process start method (vLLM's `get_mp_context` / `VLLM_WORKER_MULTIPROC_METHOD`): **fork** unless CUDA is
initialized in this process, then **spawn** (a forked child cannot use the parent's CUDA context);
`MINI_WORKER_MULTIPROC_METHOD=fork|spawn` overrides. Fork is what vLLM picks too when CUDA is not initialized:
the child starts in milliseconds (spawn re-imports torch and transformers, about 2-4 s per engine on a small
CPU) and inherits everything the parent built, the course's replaced parts (`mini.roles`) included, however
they were defined (a notebook's lambdas too). A process whose torch already ran multi-threaded kernels holds a
GNU OpenMP pool that a forked child inherits as data but not as threads: the child hung in its first parallel
region on that thread, or, on a fresh thread, ran throttled (12.3 ms a step instead of 7.4, 2 cores). So the
parent releases its pool just before the fork, as vLLM's `get_mp_context` does (mini/system_utils.py;
tests/test_openmp_pools.py), and the child still runs the core on a fresh thread (mini/engine/core_proc.py;
tests/engine/test_core_proc.py forks after parent-side kernels).
With spawn the parts must be picklable: `make_client` checks before starting and names the switch if not.
Measured on this 2-core machine (loaded): fork 0.04 s to a running child, spawn 5-6 s (it re-imports torch,
transformers and mini). The child gets the parent's torch threads, less one where the front end works while the
core steps (the server, data parallelism; `_torch_threads`).

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
import multiprocessing
import os
import pickle
import queue
import shutil
import tempfile
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
from mini.engine.core_proc import run_engine_core
from mini.engine.exceptions import EngineDeadError, EngineInternalsError, EngineStepError
from mini.metrics import message_trace
from mini.metrics.stats import SchedulerStats
from mini.serial_utils import (
    EngineCoreOutputs,
    EngineCoreOutputType,
    EngineCoreRequestType,
    decode_any,
    decode_outputs,
    encode,
    scheduler_stats_from_wire,
)
from mini.system_utils import release_libgomp_threads

logger = logging.getLogger(__name__)

ENV_MULTIPROCESSING = "MINI_ENABLE_V1_MULTIPROCESSING"
ENV_START_METHOD = "MINI_WORKER_MULTIPROC_METHOD"
ENV_CORE_THREADS = "MINI_ENGINE_CORE_THREADS"
STARTUP_TIMEOUT_S = 600.0      # loading a real checkpoint on a slow CPU
SHUTDOWN_TIMEOUT_S = 5.0
POLL_MS = 100


def multiprocessing_enabled() -> bool:
    """`MINI_ENABLE_V1_MULTIPROCESSING` (default 1): run the engine core in a child process."""
    value = os.environ.get(ENV_MULTIPROCESSING, "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{ENV_MULTIPROCESSING} must be 0 or 1, got {value!r}")


def start_method() -> str:
    """fork, unless CUDA is initialized here (then spawn); `MINI_WORKER_MULTIPROC_METHOD` overrides."""
    forced = os.environ.get(ENV_START_METHOD)
    if forced:
        if forced not in ("fork", "spawn"):
            raise ValueError(f"{ENV_START_METHOD} must be 'fork' or 'spawn', got {forced!r}")
        return forced
    import torch

    return "spawn" if torch.cuda.is_initialized() else "fork"


def internals_error(name: str) -> str:
    return (f"llm_engine.{name} lives in the engine-core process: this engine runs its core in a child "
            f"process (multiprocess mode). Set the environment variable {ENV_MULTIPROCESSING}=0 before "
            f"building the engine to keep the core, and {name}, in this process (the course's views and "
            f"phases 1-14 do; phase 15 explains the split).")


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
            if not multiprocess_mode:
                raise ValueError("an asyncio engine-core client runs the core in a child process; in-process "
                                 "asyncio callers use mini.engine.async_llm.InprocEngineCore")
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
        proc = self.proc
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(SHUTDOWN_TIMEOUT_S)
            if proc.is_alive():
                logger.warning("the engine core did not stop within %.0f s; killing it", SHUTDOWN_TIMEOUT_S)
                proc.kill()
                proc.join(SHUTDOWN_TIMEOUT_S)
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
        method = start_method()
        if method == "spawn":
            _check_picklable(config)
        self.resources = resources = BackgroundResources()
        self._finalizer = weakref.finalize(self, resources.close)
        resources.socket_dir = tempfile.mkdtemp(prefix="mini-engine-")
        input_address = f"ipc://{resources.socket_dir}/input"
        output_address = f"ipc://{resources.socket_dir}/output"
        # A plain context for the handshake and the sync client; the async client adds an asyncio one.
        resources.context = context = zmq.Context()
        resources.input_socket = context.socket(zmq.PUSH)
        resources.input_socket.setsockopt(zmq.LINGER, 0)
        resources.input_socket.bind(input_address)
        resources.output_socket = context.socket(zmq.PULL)
        resources.output_socket.setsockopt(zmq.LINGER, 0)
        resources.output_socket.bind(output_address)
        mp_context = multiprocessing.get_context(method)
        resources.proc = mp_context.Process(
            target=run_engine_core, name="mini-engine-core",
            args=(config, input_address, output_address, resources.socket_dir,
                  _torch_threads(front_end_threads)))
        if method == "fork":
            release_libgomp_threads()   # or the child hangs in, or throttles, its OpenMP (mini/system_utils.py)
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
        resources = self.resources
        poller = zmq.Poller()
        poller.register(resources.output_socket, zmq.POLLIN)
        poller.register(resources.proc.sentinel, zmq.POLLIN)
        waited_ms = 0
        while waited_ms < STARTUP_TIMEOUT_S * 1000:
            events = dict(poller.poll(POLL_MS))
            if resources.output_socket in events:
                kind, data, *rest = resources.output_socket.recv_multipart()
                kind = EngineCoreOutputType(kind)
                if kind is EngineCoreOutputType.READY:
                    return decode_any(data)
                raise _startup_error(resources.proc.pid, data.decode(), rest[0] if rest else b"")
            if resources.proc.sentinel in events:
                raise RuntimeError(f"the engine-core process exited during start-up "
                                   f"(exit code {resources.proc.exitcode}) without reporting why")
            waited_ms += POLL_MS
        raise TimeoutError(f"the engine core did not start within {STARTUP_TIMEOUT_S:.0f} s")

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


def _startup_error(pid: int, text: str, pickled: bytes) -> BaseException:
    """The child's start-up error as itself (when it unpickles), with the child's traceback as a note."""
    note = f"raised while starting the engine core (in its process, pid {pid}):\n{text}"
    try:
        error = pickle.loads(pickled) if pickled else None
    except Exception:  # noqa: BLE001  (any unpickling failure: fall back to the text)
        error = None
    if not isinstance(error, Exception):
        return RuntimeError(f"the engine core failed to start; {note}")
    error.add_note(note)
    return error


def _torch_threads(front_end_threads: int = 1) -> int:
    """The engine core's torch threads: this process's count less `front_end_threads` (at least 1);
    `MINI_ENGINE_CORE_THREADS` overrides.

    A front end that works while the core steps (the server's asyncio loop, `AsyncMPClient`; a data-parallel
    core) keeps one, as vLLM's CPU backend keeps a core back from its OpenMP threads for its engine-core process
    (vllm/utils/ompmultiprocessing.py; there a separate worker process runs the model). `LLM`'s front end waits
    while the core steps, so `make_client` gives that core every thread, with async scheduling too: its two
    threads hold the OpenMP pool in turns (mini/executor/uniproc_executor.py).
    Measured on 2 cores: `LLM.generate` of `python -m mini bench`'s workload ran at 1,684-1,795 output tok/s with
    1 core thread, 1,925-2,128 with 2, 1,880-2,012 in process. Before the engine gave OpenMP pools back (at the
    fork, and between the core's thread and its worker thread: mini/system_utils.py), an async-scheduling core
    with 2 threads took 14.1-15.5 ms a step against 9.3 with 1 (`python -m mini bench async_scheduling
    --multiprocess`), and 64 streaming clients of the server 48 s with 2 core threads against 5.6 s with 1, both
    likely libgomp's throttling. Since then async scheduling ran at 0.95-1.08 of sync with 2 core threads and
    0.93-1.02 with 1 (`async_speedup`, 8 runs), and `python -m mini bench serve --concurrency 16,64` peaked at
    1,740-1,768 tok/s with 2 and 1,511-2,297 with 1: within the noise both ways, so an async core takes every
    thread like a sync one, and the server keeps vLLM's rule."""
    forced = os.environ.get(ENV_CORE_THREADS)
    if forced:
        if not forced.isdigit() or int(forced) < 1:
            raise ValueError(f"{ENV_CORE_THREADS} must be a positive int, got {forced!r}")
        return int(forced)
    import torch

    return max(1, torch.get_num_threads() - front_end_threads)


def _check_picklable(config: EngineConfig) -> None:
    try:
        pickle.dumps(config)
    except Exception as error:
        raise TypeError(
            f"the engine core starts with 'spawn' here (CUDA is initialized in this process, or "
            f"{ENV_START_METHOD}=spawn), so its config and replaced parts are pickled to reach it, and they "
            f"cannot be: {error}. Define the replaced functions at a module's top level, or run the engine "
            f"core in this process with {ENV_MULTIPROCESSING}=0.") from error


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
class AsyncMPClient(MPClient):
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
