"""Starting the engine-core process: sockets, the process itself, its handshake, and stopping it.

Mirrors vllm/v1/engine/utils.py (`launch_core_engines`, `wait_for_engine_startup`, `CoreEngineProcManager`:
start the core's process, wait until it reports ready, terminate it then kill it at shutdown). The clients that
talk to the process once it runs stay in mini/engine/core_client.py, as in vLLM; `MPClient` calls these.

    launch_core_engine(resources, ...)   bind the two ZMQ sockets in a temporary directory, build the process
                                         (fork or spawn: `start_method`) with its torch thread count
    wait_for_engine_startup(resources)   READY -> the core's `startup_info()`; a start-up error re-raised here
    shutdown_core_process(proc)          SIGTERM, then SIGKILL after `SHUTDOWN_TIMEOUT_S`

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
With spawn the parts must be picklable: `launch_core_engine` checks before starting and names the switch if not.
Measured on this 2-core machine (loaded): fork 0.04 s to a running child, spawn 5-6 s (it re-imports torch,
transformers and mini). The child gets the parent's torch threads, less one where the front end works while the
core steps (the server, data parallelism; `_torch_threads`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import tempfile
from typing import Any

import zmq

from mini.config import EngineConfig
from mini.engine.core_proc import run_engine_core
from mini.serial_utils import EngineCoreOutputType, decode_any
from mini.system_utils import release_libgomp_threads

logger = logging.getLogger(__name__)

ENV_MULTIPROCESSING = "MINI_ENABLE_V1_MULTIPROCESSING"
ENV_START_METHOD = "MINI_WORKER_MULTIPROC_METHOD"
ENV_CORE_THREADS = "MINI_ENGINE_CORE_THREADS"
STARTUP_TIMEOUT_S = 600.0      # loading a real checkpoint on a slow CPU
SHUTDOWN_TIMEOUT_S = 5.0
POLL_MS = 100


def start_method() -> str:
    """fork, unless CUDA is initialized here (then spawn); `MINI_WORKER_MULTIPROC_METHOD` overrides."""
    forced = os.environ.get(ENV_START_METHOD)
    if forced:
        if forced not in ("fork", "spawn"):
            raise ValueError(f"{ENV_START_METHOD} must be 'fork' or 'spawn', got {forced!r}")
        return forced
    import torch

    return "spawn" if torch.cuda.is_initialized() else "fork"


def launch_core_engine(resources: Any, config: EngineConfig,
                       front_end_threads: int) -> None:
    """Bind the core's sockets under a new temporary directory and build its process (not started yet) in
    `resources` (a `BackgroundResources`, mini/engine/core_client.py)."""
    method = start_method()
    if method == "spawn":
        _check_picklable(config)
    # The creating process's pid in the name: whose folder it is, when several engines share one temp dir.
    resources.socket_dir = tempfile.mkdtemp(prefix=f"mini-engine-{os.getpid()}-")
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


def wait_for_engine_startup(resources: Any) -> dict[str, Any]:
    """The core's READY message -> its `startup_info()`; its start-up error, raised here (vLLM:
    `wait_for_engine_startup`)."""
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


def shutdown_core_process(proc: Any) -> None:
    """Stop the core's process: SIGTERM, then SIGKILL (vLLM: `CoreEngineProcManager.shutdown`)."""
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(SHUTDOWN_TIMEOUT_S)
        if proc.is_alive():
            logger.warning("the engine core did not stop within %.0f s; killing it", SHUTDOWN_TIMEOUT_S)
            proc.kill()
            proc.join(SHUTDOWN_TIMEOUT_S)


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
