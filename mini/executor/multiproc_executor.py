"""One worker process per tensor-parallel rank (mirrors vllm/v1/executor/multiproc_executor.py).

Layout, as vLLM's: the engine core's process holds NO model. `MultiprocExecutor` starts N worker processes
(`worker_main`, vLLM's `WorkerProc.worker_main`), rank 0 .. N-1; each joins the torch.distributed group
(gloo on the CPU, NCCL on CUDA with rank r on `cuda:{r}`: mini/distributed/parallel_state.py), builds a
`Worker` (mini/worker/worker.py) that loads ITS shard of the weights and profiles, and says how many KV
blocks it could hold. The executor takes the smallest count (every rank must hold the same block table)
and has every worker allocate that many. Then, each step:

    engine core:  pickle (method, SchedulerOutput, grammar bitmask) ONCE, write the bytes to every worker
    every rank:   the same `ModelRunner.execute_model`: forward (its heads, its slice of the MLP, the
                  all-reduces after o_proj and down_proj), all-gathered logits, sampling (same seed, same
                  logits -> the same tokens on every rank, so every rank's copy of the batch stays in step)
    rank 0:       sends the `ModelRunnerOutput` back; the others send an empty acknowledgement

Where mini differs, and why:
  - Transport: vLLM broadcasts through a shared-memory ring buffer (`MessageQueue`,
    vllm/distributed/device_communicators/shm_broadcast.py) and only the output rank answers. mini writes
    the same pickled bytes to one `multiprocessing` pipe per worker, and EVERY worker answers (rank 0 with
    the output, the others with None): a failure on any rank then surfaces at once as that rank's error,
    instead of as rank 0 waiting in a collective. A step costs N small pipe writes; fine for a few ranks.
  - Start method: fork on the CPU, so that parts chosen through `mini.roles` (e.g. a learner's layer
    defined in a notebook, which cannot be pickled by reference) reach the workers as they are; spawn once
    CUDA is initialized in this process (a forked child cannot use CUDA), as vLLM's `_maybe_force_spawn`.
    Before forking, libgomp's idle threads are released (vLLM's `_release_libgomp_threads`): a child forked
    after the parent ran an OpenMP region would otherwise hang in its first one.
  - Orphans: the workers are daemonic (joined or killed at the parent's normal exit), `shutdown` (also
    run when the executor is garbage-collected) asks them to stop, joins them and kills what remains, and
    each worker runs a watchdog thread that exits the moment its parent process is gone (vLLM: a death
    pipe per worker), so a crashed or killed engine leaves no process behind.
  - Step observers (mini/metrics/step_trace.py) get no runner-side details from a tensor-parallel engine:
    the trace lives in the engine core's process, the runners in the workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import socket
import threading
import time
import traceback
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from mini.config import EngineConfig
from mini.engine.exceptions import EngineDeadError
from mini.executor.abstract import Executor
from mini.metrics import message_trace
from mini.runner_outputs import ModelRunnerOutput
from mini.system_utils import release_libgomp_threads

# How long shutdown waits for a worker to leave on its own before it is terminated, then killed.
SHUTDOWN_JOIN_SECONDS = 5.0
# How often a worker's watchdog checks that its parent is alive.
PARENT_CHECK_SECONDS = 0.5
START_METHOD_ENV = "MINI_WORKER_MULTIPROC_METHOD"


class WorkerDiedError(EngineDeadError):
    """A tensor-parallel worker process died or failed; the engine cannot go on without it."""


@dataclass(slots=True)
class WorkerHandle:
    """The engine core's end of one worker: its rank, its process and its pipe."""

    rank: int
    process: Any          # multiprocessing.Process
    conn: Any             # multiprocessing.connection.Connection

    def describe(self) -> str:
        return f"tensor-parallel worker rank {self.rank} (pid {self.process.pid})"


# ---------------------------------------------------------------------------------- the engine core's side
class MultiprocExecutor(Executor):
    """Runs the model on `config.tensor_parallel_size` worker processes, one per rank."""

    def _init_executor(self) -> None:
        config = self.config
        self.world_size = int(config.tensor_parallel_size)
        if getattr(config, "async_scheduling", False):   # the workers take step N+1 while step N runs
            self.max_concurrent_batches = 2
        verify_tensor_parallel_config(config)       # a size the heads do not divide: ValueError, nothing started
        self.workers: list[WorkerHandle] = []
        self._in_flight: deque[Future] = deque()    # steps sent to the workers, oldest first
        self._failure: str | None = None
        self._lock = threading.RLock()
        self.start_method = worker_start_method()
        context = multiprocessing.get_context(self.start_method)
        if self.start_method == "fork":
            release_libgomp_threads()
        # The rendezvous: rank 0 listens on a free local port (vLLM: `get_distributed_init_method("127.0.0.1",
        # get_open_port())`); a TCP store leaves no file behind, even when this process is killed.
        init_method = f"tcp://127.0.0.1:{get_open_port()}"
        # Stops the workers started so far when shut down, garbage-collected, or when a start fails below.
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers)
        try:
            for rank in range(self.world_size):
                parent_conn, child_conn = context.Pipe(duplex=True)
                process = context.Process(
                    target=worker_main, name=f"mini-tp-worker-{rank}", daemon=True,
                    kwargs={"config": config, "rank": rank, "init_method": init_method,
                            "conn": child_conn, "parent_pid": os.getpid()})
                process.start()
                child_conn.close()
                self.workers.append(WorkerHandle(rank, process, parent_conn))
            ready = self._collect_replies()          # each: what its Worker loaded and could hold
            self.num_gpu_blocks = min(int(reply["num_blocks"]) for reply in ready)
            self.config = dataclasses.replace(config, max_model_len=ready[0]["max_model_len"])
            self.hf_config = ready[0]["hf_config"]
            self.startup_report = ready[0]["startup_report"]
            self.collective_rpc("initialize_cache", self.num_gpu_blocks)
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ messages to every worker
    def _broadcast(self, method: str, *args: Any) -> None:
        """Pickle the call once and write the same bytes to every worker (vLLM: `rpc_broadcast_mq.enqueue`)."""
        self.check_health()
        payload = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        if message_trace.ON:
            message_trace.record("engine core", "send", method, nbytes=len(payload), to=len(self.workers),
                                 request_ids=list(getattr(args[0], "num_scheduled_tokens", {}) if args else []))
        try:
            for worker in self.workers:
                worker.conn.send_bytes(payload)
        except (BrokenPipeError, ConnectionResetError, OSError) as error:
            self._fail(f"could not send {method!r} to a tensor-parallel worker: {error}")

    def _collect_replies(self) -> list[Any]:
        """Every worker's reply to the oldest message, in rank order; raises `WorkerDiedError` as soon as a
        worker answers with an error or dies (its pipe closes or its process sentinel fires)."""
        replies: dict[int, Any] = {}
        waiting = {worker.conn: worker for worker in self.workers}
        while waiting:
            sentinels = {worker.process.sentinel: worker for worker in waiting.values()}
            for handle in multiprocessing.connection.wait(list(waiting) + list(sentinels)):
                if handle in sentinels and sentinels[handle].conn in waiting:
                    worker = sentinels[handle]
                    if not worker.conn.poll():   # died without a reply waiting to be read
                        worker.process.join(timeout=1.0)
                        self._fail(f"{worker.describe()} died (exit code {worker.process.exitcode})")
                if handle not in waiting:
                    continue
                worker = waiting.pop(handle)
                try:
                    status, value = worker.conn.recv()
                except (EOFError, OSError):
                    worker.process.join(timeout=1.0)
                    self._fail(f"{worker.describe()} died (exit code {worker.process.exitcode})")
                if status != "ok":
                    self._fail(f"{worker.describe()} failed:\n{value}")
                replies[worker.rank] = value
        if message_trace.ON:
            message_trace.record("engine core", "recv", "replies", ranks=sorted(replies))
        return [replies[rank] for rank in range(self.world_size)]

    def _fail(self, message: str) -> None:
        """Remember that the workers are unusable (check_health raises from now on) and raise."""
        if self._failure is None:
            self._failure = message
        raise WorkerDiedError(message)

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call `Worker.<method>(*args)` on every rank and wait -> the replies in rank order (vLLM's
        `collective_rpc`). Not while steps are in flight."""
        with self._lock:
            self._finish_in_flight()
            self._broadcast(method, *args)
            return self._collect_replies()

    # ------------------------------------------------------------------ steps
    def execute_model(self, scheduler_output: Any, grammar_output: Any = None,
                      trace: Any = None) -> ModelRunnerOutput:
        """One step on every rank; rank 0's `ModelRunnerOutput` (the sampled tokens)."""
        return self.execute_model_non_block(scheduler_output, grammar_output).result()

    def execute_model_non_block(self, scheduler_output: Any, grammar_output: Any = None) -> Future[ModelRunnerOutput]:
        """Send the step to the workers and return at once; its future reads the replies when asked
        (vLLM: `execute_model(..., non_block=True)` -> `FutureWrapper`). Workers answer in order, so
        taking a later step's result first takes the earlier ones' too."""
        future = _StepFuture(self)
        with self._lock:
            self._broadcast("execute_model", scheduler_output, grammar_output)
            self._in_flight.append(future)
        return future

    def _finish_until(self, target: Future) -> None:
        with self._lock:
            while self._in_flight and not target.done():
                self._finish_oldest()

    def _finish_in_flight(self) -> None:
        while self._in_flight:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        future = self._in_flight.popleft()
        try:
            future.set_result(self._collect_replies()[0])
        except Exception as error:  # noqa: BLE001 - handed to whoever takes the result
            future.set_exception(error)
            for later in self._in_flight:   # the workers are gone: every later step fails the same way
                later.set_exception(error)
            self._in_flight.clear()

    # ------------------------------------------------------------------ health and shutdown
    def check_health(self) -> None:
        """Raise `WorkerDiedError` if a worker has died or failed (vLLM: `MultiprocExecutor.check_health`)."""
        if self.is_shutdown:
            raise WorkerDiedError("the tensor-parallel executor has been shut down")
        if self._failure is not None:
            raise WorkerDiedError(self._failure)
        for worker in self.workers:
            if not worker.process.is_alive():
                self._fail(f"{worker.describe()} died (exit code {worker.process.exitcode})")

    def shutdown(self) -> None:
        """Ask every worker to stop, join them, kill what remains. Idempotent."""
        if self.is_shutdown:
            return
        self.is_shutdown = True
        in_flight = getattr(self, "_in_flight", deque())
        while in_flight:
            future = in_flight.popleft()
            if not future.done():
                future.set_exception(WorkerDiedError("the tensor-parallel executor was shut down"))
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:
            _stop_workers(getattr(self, "workers", []))

    @property
    def worker_pids(self) -> list[int]:
        """The workers' process ids, rank order (for tests and the course's process view)."""
        return [worker.process.pid for worker in self.workers]


def verify_tensor_parallel_config(config: EngineConfig) -> None:
    """ValueError naming the head counts when `config.tensor_parallel_size` does not fit the checkpoint.

    vLLM checks this in `ModelConfig.verify_with_parallel_config` before any process starts; mini reads the
    checkpoint's config.json (nothing else), so the front end can call it before it starts the engine core."""
    from mini.model.llama import DecoderConfig, check_tensor_parallel_size
    from mini.model.loader import read_hf_config

    check_tensor_parallel_size(DecoderConfig.from_hf_config(read_hf_config(config.model_dir)),
                               int(config.tensor_parallel_size))


class _StepFuture(Future):
    """A step's result, read from the workers when it is asked for (vLLM: `FutureWrapper`)."""

    def __init__(self, executor: MultiprocExecutor) -> None:
        super().__init__()
        self._executor = executor

    def result(self, timeout: float | None = None) -> Any:
        self._executor._finish_until(self)
        return super().result(timeout)


def _stop_workers(workers: list[WorkerHandle]) -> None:
    """Stop message, join, then terminate and kill; close the pipes."""
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.conn.send_bytes(pickle.dumps(("shutdown", ())))
    deadline = time.monotonic() + SHUTDOWN_JOIN_SECONDS
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(timeout=1.0)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=1.0)
        with contextlib.suppress(OSError):
            worker.conn.close()


def get_open_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it; vLLM: `get_open_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def worker_start_method() -> str:
    """fork, unless CUDA is already initialized in this process (then spawn; module docstring).

    `MINI_WORKER_MULTIPROC_METHOD=spawn` forces spawn (vLLM: `VLLM_WORKER_MULTIPROC_METHOD`); a CUDA-initialized
    process spawns whatever it says."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return "spawn"
    method = os.environ.get(START_METHOD_ENV, "fork").strip().lower()
    if method not in ("fork", "spawn"):
        raise ValueError(f"{START_METHOD_ENV} must be 'fork' or 'spawn', got {method!r}")
    return method


# ---------------------------------------------------------------------------------- the worker's side
def worker_main(config: EngineConfig, rank: int, init_method: str, conn: Any,
                parent_pid: int) -> None:
    """A worker process: join the group, load this rank's shard, profile, then serve calls until told to stop.

    Mirrors `WorkerProc.worker_main` + `worker_busy_loop` (vllm/v1/executor/multiproc_executor.py) and
    `init_worker_distributed_environment` (vllm/v1/worker/gpu_worker.py)."""
    from mini.distributed.parallel_state import (
        destroy_distributed_environment,
        init_worker_distributed_environment,
    )
    from mini.worker.worker import Worker

    _watch_parent(parent_pid)
    try:
        try:
            config = _config_for_rank(config, rank)
            init_worker_distributed_environment(config, rank, init_method)
            torch.manual_seed(config.seed)        # same seed on every rank: the same samples from the same logits
            worker = Worker(config, rank=rank)
            worker.load_model()
            num_blocks = worker.determine_num_blocks()
            conn.send(("ok", {"num_blocks": num_blocks, "max_model_len": worker.config.max_model_len,
                              "hf_config": worker.hf_config if rank == 0 else None,
                              "startup_report": worker.startup_report if rank == 0 else None}))
        except Exception:  # noqa: BLE001 - reported to the engine core, which raises it
            conn.send(("error", traceback.format_exc()))
            return
        _busy_loop(worker, rank, conn)
    finally:
        destroy_distributed_environment()
        with contextlib.suppress(OSError):
            conn.close()


def _busy_loop(worker: Any, rank: int, conn: Any) -> None:
    """Run each call the engine core broadcasts; reply to each (rank 0 with the step's output)."""
    while True:
        try:
            method, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):   # the engine core is gone
            return
        if method == "shutdown":
            return
        if message_trace.ON:
            message_trace.record(f"worker {rank}", "recv", method)
        try:
            result = getattr(worker, method)(*args)
            # Only rank 0's step output is used: the others answer None instead of pickling the same tokens.
            reply = ("ok", None if method == "execute_model" and rank != 0 else result)
        except Exception:  # noqa: BLE001 - reported to the engine core, which raises it
            reply = ("error", traceback.format_exc())
        if message_trace.ON:
            message_trace.record(f"worker {rank}", "send", "reply", rank0_output=rank == 0)
        conn.send(reply)


def _config_for_rank(config: EngineConfig, rank: int) -> EngineConfig:
    """Rank r's config: on CUDA its own device `cuda:{r}`; on the CPU its share of the cores."""
    if str(config.device).startswith("cuda"):
        return dataclasses.replace(config, device=f"cuda:{rank}")
    threads = max(1, (os.cpu_count() or 1) // int(config.tensor_parallel_size))
    torch.set_num_threads(min(threads, torch.get_num_threads()))
    return config


def _watch_parent(parent_pid: int) -> None:
    """Exit this worker as soon as its parent is gone (a crashed engine core must leave no worker behind)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(PARENT_CHECK_SECONDS)

    threading.Thread(target=watch, name="mini-tp-parent-watchdog", daemon=True).start()


__all__ = ["MultiprocExecutor", "WorkerDiedError", "verify_tensor_parallel_config", "worker_main",
           "worker_start_method"]
