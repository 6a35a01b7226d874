"""The engine core in its own process: a busy loop between two sockets.

Mirrors vllm/v1/engine/core.py (`EngineCoreProc`: `run_engine_core`, `run_busy_loop`,
`process_input_sockets`, `process_output_sockets`, `_handle_client_request`, `_send_engine_dead`).
Why a file apart from core.py (vLLM keeps `EngineCoreProc` in core.py): `EngineCore` is what the course reads
step by step; the sockets, threads and signals of its process are phase 14's, and together they would not fit
one small file.

The child process runs three threads, as vLLM's:

    input thread    input socket (PULL) -> decode -> input queue        (the model never waits for decoding)
    main thread     busy loop: drain the input queue (ADD / ABORT / UTILITY); step(); outputs -> output queue;
                    with nothing to run, block on the input queue
    output thread   output queue -> encode -> output socket (PUSH)

Start-up handshake: the child builds the `EngineCore` and sends READY with `startup_info()` (what the front
end checks requests against) or STARTUP_FAILED with the error (pickled, so a `ValueError` about a bad argument
reaches the caller as one) and its traceback, which the client re-raises.
(vLLM uses a separate handshake socket and also exchanges the socket addresses there; mini's parent binds
both sockets in a temporary directory before starting the child, so the handshake rides on the output socket.)

Errors: a step that raises is not the end of the core. Its requests cannot be told apart (one batch), so all
the requests in flight are aborted in the core and reported in `EngineCoreOutputs.failed_requests`; the
front end fails them with `EngineStepError` and the core keeps serving. vLLM instead treats any step error as
fatal (`_send_engine_dead`); mini only does so when the recovery itself fails, or the loop breaks: it sends
DEAD with the error, then exits.

Threads and signals: the core (construction included) runs on a fresh thread; the main thread only waits and
takes signals (see `run_engine_core` for why: GNU OpenMP and fork; the parent also releases its OpenMP pool
before forking, as vLLM's `_release_libgomp_threads` in vllm/utils/system_utils.py: mini/system_utils.py).
SIGTERM is the client's shutdown request: the busy loop stops after its step, the output queue is flushed, the
executor's workers stopped. SIGINT is ignored: a Ctrl-C in a terminal reaches the whole process group, and it is the
front end's to decide (it shuts the core down when it exits). A parent killed with SIGKILL runs no clean-up, so a
watcher thread waits on the parent's sentinel (`multiprocessing.parent_process()`, a pipe whose write end only the
parent holds) and, when the parent is gone, stops the loop, removes the socket directory and exits (vLLM's engine
core dies with its parent through `prctl(PR_SET_PDEATHSIG)`-like death pipes too; mini avoids PDEATHSIG, which fires
when the parent *thread* that started the child exits).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import shutil
import signal
import threading
import time
import traceback
from multiprocessing import connection, parent_process
from typing import Any

import zmq

from mini.config import EngineConfig
from mini.core.request import RequestStatus
from mini.engine.core import EngineCore
from mini.metrics import message_trace
from mini.metrics.stats import SchedulerStats
from mini.serial_utils import (
    EngineCoreOutputs,
    EngineCoreOutputType,
    EngineCoreRequestType,
    UtilityOutput,
    decode_any,
    decode_request,
    encode,
)

logger = logging.getLogger(__name__)

# How often the socket threads look up from a quiet socket to check for shutdown.
POLL_MS = 100
# A parent gone: how long the loop may take to finish its step before the child exits anyway.
PARENT_DEATH_GRACE_S = 5.0

# What `ps -o comm` shows for an engine-core process (Linux).
PROCESS_NAME = "mini_enginecore"

_SHUTDOWN = object()   # on the input queue: leave the busy loop


class EngineCoreProc:
    """An `EngineCore` behind an input queue and an output queue, fed and drained by socket threads."""

    def __init__(self, engine_core: EngineCore, input_address: str, output_socket: zmq.Socket,
                 context: zmq.Context) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.Queue[Any] = queue.Queue()
        self.output_queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._input_thread = threading.Thread(target=self._process_input_socket, args=(context, input_address),
                                              name="mini-core-input", daemon=True)
        self._output_thread = threading.Thread(target=self._process_output_socket, args=(output_socket,),
                                               name="mini-core-output", daemon=True)
        self._input_thread.start()
        self._output_thread.start()

    # ------------------------------------------------------------------ the busy loop (main thread)
    def run_busy_loop(self) -> None:
        """Until shutdown: take in what arrived, then run one step (vLLM's `run_busy_loop`)."""
        while self._process_input_queue():
            self._process_engine_step()

    def _process_input_queue(self) -> bool:
        """Handle every queued message; block for one while the core has nothing to run. False: shut down."""
        if not self.engine_core.has_unfinished_requests():
            item = self.input_queue.get()
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)
        while True:
            try:
                item = self.input_queue.get_nowait()
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)

    def _process_engine_step(self) -> None:
        core = self.engine_core
        if not core.has_unfinished_requests():
            return
        try:
            outputs = core.step()
        except Exception as error:
            logger.exception("engine-core step failed; aborting the requests in flight")
            failed = list(core.scheduler.requests)
            core.abort_requests(failed)   # if this raises too, the loop dies and reports DEAD
            message = f"the engine step failed: {error!r}"
            self.output_queue.put(EngineCoreOutputs(failed_requests=dict.fromkeys(failed, message),
                                                    scheduler_stats=self._scheduler_stats(),
                                                    timestamp=time.monotonic()))
            return
        if message_trace.ON:
            message_trace.record("engine core", "step", "step", request_ids=[o.request_id for o in outputs or ()])
        if outputs:
            self.output_queue.put(EngineCoreOutputs(outputs=outputs, scheduler_stats=self._scheduler_stats(),
                                                    timestamp=time.monotonic()))

    def _scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats.from_scheduler(self.engine_core.scheduler)

    def _handle_client_request(self, request_type: EngineCoreRequestType, payload: Any) -> None:
        core = self.engine_core
        if request_type is EngineCoreRequestType.ADD:
            try:
                core.add_request(payload)
            except Exception as error:
                logger.exception("engine core refused request %s", payload.request_id)
                self.output_queue.put(EngineCoreOutputs(
                    failed_requests={payload.request_id: f"the engine core refused the request: {error!r}"}))
        elif request_type is EngineCoreRequestType.ABORT:
            request_ids, status_name = payload
            core.finish_requests(request_ids, RequestStatus[status_name])
        elif request_type is EngineCoreRequestType.UTILITY:
            call_id, method_name, args = payload
            self.output_queue.put(EngineCoreOutputs(utility_output=self._call_utility(call_id, method_name, args)))

    def _call_utility(self, call_id: int, method_name: str, args: list[Any]) -> UtilityOutput:
        """vLLM's utility calls: a method of the core by name; its result or its error goes back."""
        try:
            method = UTILITY_METHODS.get(method_name)
            if method is None:
                raise ValueError(f"unknown utility call {method_name!r}; known: {sorted(UTILITY_METHODS)}")
            result = method(self, *args)
            if hasattr(result, "__dataclass_fields__"):
                result = decode_any(encode(result))   # plain data on the wire; the client rebuilds the type
            return UtilityOutput(call_id, result=result)
        except Exception as error:  # noqa: BLE001  (the caller gets the error, the core carries on)
            return UtilityOutput(call_id, failure_message=f"{type(error).__name__}: {error}")

    # ------------------------------------------------------------------ the socket threads
    def _process_input_socket(self, context: zmq.Context, address: str) -> None:
        """Input thread: decode each message and queue it for the busy loop (vLLM's `process_input_sockets`)."""
        socket = context.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(address)
        try:
            while not self._stop.is_set():
                if not socket.poll(POLL_MS):
                    continue
                type_frame, data = socket.recv_multipart(copy=False)
                request_type = EngineCoreRequestType(bytes(type_frame.buffer))
                if request_type is EngineCoreRequestType.ADD:
                    payload = decode_request(data.buffer)
                else:
                    payload = decode_any(data.buffer)
                if message_trace.ON:
                    message_trace.record("engine core", "recv", request_type.name, nbytes=len(data.buffer),
                                         request_ids=message_trace.request_ids_of(payload))
                self.input_queue.put((request_type, payload))
        except Exception:
            logger.exception("engine-core input thread failed")
            self.output_queue.put((EngineCoreOutputType.DEAD, traceback.format_exc()))
            self.input_queue.put(_SHUTDOWN)
        finally:
            socket.close(linger=0)

    def _process_output_socket(self, socket: zmq.Socket) -> None:
        """Output thread: encode and send what the busy loop produced (vLLM's `process_output_sockets`)."""
        while True:
            item = self.output_queue.get()
            if item is _SHUTDOWN:
                return
            if isinstance(item, tuple):          # (DEAD, text)
                socket.send_multipart([item[0].value, item[1].encode()])
            else:
                data = encode(item)
                if message_trace.ON:
                    message_trace.record("engine core", "send", "OUTPUTS", nbytes=len(data),
                                         request_ids=message_trace.request_ids_of(item))
                socket.send_multipart([EngineCoreOutputType.OUTPUTS.value, data])

    def shutdown(self) -> None:
        """Stop the threads (after the output queue is flushed) and the core's executor."""
        self._stop.set()
        self.output_queue.put(_SHUTDOWN)
        self._output_thread.join(5.0)
        self._input_thread.join(1.0)
        self.engine_core.shutdown()


def _utility_free_blocks(proc: EngineCoreProc) -> int:
    return proc.engine_core.kv_cache_manager.block_pool.get_num_free_blocks()


UTILITY_METHODS: dict[str, Any] = {
    "reset_prefix_cache": lambda proc: proc.engine_core.reset_prefix_cache(),
    "get_scheduler_stats": lambda proc: proc._scheduler_stats(),
    "get_num_free_blocks": _utility_free_blocks,
    "get_num_unfinished_requests": lambda proc: proc.engine_core.get_num_unfinished_requests(),
    "is_sleeping": lambda proc: False,
    "ping": lambda proc: "pong",
    "fail_next_step": lambda proc, message: _fail_next_step(proc, message),
}


def _fail_next_step(proc: EngineCoreProc, message: str) -> bool:
    """For tests: the next `step()` raises RuntimeError(message) once (the recovery path)."""
    core = proc.engine_core
    original = core.step

    def failing_step() -> Any:
        core.step = original
        raise RuntimeError(message)

    core.step = failing_step
    return True


# ---------------------------------------------------------------------------- the child's entry point
def run_engine_core(config: EngineConfig, input_address: str, output_address: str,
                    socket_dir: str, num_threads: int | None = None) -> None:
    """The engine-core process (vLLM's `EngineCoreProc.run_engine_core`): handshake, then the busy loop.

    The core runs on a fresh thread, the main thread only waits for it and takes the signals. In a forked
    child this is what keeps torch usable: GNU OpenMP (torch's intra-op pool on CPU) is not fork-safe, and
    a parallel region entered from the forked main thread waits forever for the parent's pool threads
    (tests/engine/test_core_proc.py forks after parent-side kernels); a new thread gets a pool of its own.
    `make_client` also releases the parent's pool before it forks (mini/system_utils.py): without that, the
    child's libgomp still counts the parent's workers and throttles the new thread's pool. The fresh thread
    stays as the second guard, for a libgomp without `omp_pause_resource_all` (before GCC 9).
    `num_threads`: the parent's `torch.get_num_threads()`, which that new thread would not inherit.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_process_name(PROCESS_NAME)
    holder: dict[str, EngineCoreProc] = {}

    def on_sigterm(signum: int, frame: Any) -> None:
        proc = holder.get("proc")
        if proc is None:             # still starting up: nothing to flush
            os._exit(0)
        proc.input_queue.put(_SHUTDOWN)

    signal.signal(signal.SIGTERM, on_sigterm)
    thread = threading.Thread(target=_run_core_thread, name="mini-engine-core",
                              args=(config, input_address, output_address, socket_dir, holder,
                                    num_threads))
    thread.start()
    while thread.is_alive():
        thread.join(0.5)


def _run_core_thread(config: EngineConfig, input_address: str, output_address: str,
                     socket_dir: str, holder: dict[str, EngineCoreProc], num_threads: int | None) -> None:
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)
    context = zmq.Context()
    output_socket = context.socket(zmq.PUSH)
    output_socket.setsockopt(zmq.LINGER, 2000)
    output_socket.connect(output_address)
    proc: EngineCoreProc | None = None
    try:
        try:
            engine_core = EngineCore(config)
        except BaseException as error:  # noqa: BLE001  (any start-up failure goes to the front end)
            try:    # the error itself when it pickles (a ValueError naming a bad argument stays one), + its text
                pickled = pickle.dumps(error)
            except Exception:  # noqa: BLE001  (an unpicklable error: its text still goes)
                pickled = b""
            output_socket.send_multipart([EngineCoreOutputType.STARTUP_FAILED.value,
                                          traceback.format_exc().encode(), pickled])
            return   # the front end raises it
        output_socket.send_multipart([EngineCoreOutputType.READY.value, encode(engine_core.startup_info())])
        proc = holder["proc"] = EngineCoreProc(engine_core, input_address, output_socket, context)
        _watch_parent(proc, socket_dir)
        proc.run_busy_loop()
    except BaseException:
        logger.exception("the engine core died")
        if proc is not None:
            proc.output_queue.put((EngineCoreOutputType.DEAD, traceback.format_exc()))
    finally:
        if proc is not None:
            proc.shutdown()
        output_socket.close(linger=1000)
        context.term()


def _set_process_name(name: str) -> None:
    """The name `ps` / `/proc/<pid>/comm` show (Linux; 15 bytes), so a leftover core is easy to spot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _watch_parent(proc: EngineCoreProc, socket_dir: str) -> None:
    """When the parent process dies (even by SIGKILL), stop the loop, remove the sockets, exit."""
    parent = parent_process()
    if parent is None:
        return

    def watch() -> None:
        connection.wait([parent.sentinel])
        logger.warning("the front-end process is gone; the engine core shuts down")
        shutil.rmtree(socket_dir, ignore_errors=True)
        proc.input_queue.put(_SHUTDOWN)
        time.sleep(PARENT_DEATH_GRACE_S)
        os._exit(1)   # the step did not finish in time

    threading.Thread(target=watch, name="mini-core-parent-watch", daemon=True).start()
