"""Data parallelism: N engine cores behind one front end, each request to the least-loaded core.

Why a file of its own (vLLM keeps these clients in core_client.py): core_client.py already holds four clients
(in process, sync, asyncio, in-process asyncio); the N-core clients build on them and read on their own.

Mirrors vllm/v1/engine/core_client.py (`DPAsyncMPClient`, `DPLBAsyncMPClient`: one front end, N engine-core
processes, requests load-balanced, aborts sent to the owning core, the cores' outputs merged into one stream)
and the part of vllm/v1/engine/coordinator.py (`DPCoordinator`) that collects each core's `[waiting, running]`
counts for the balancer. The routing rule itself is `mini.engine.dp_routing` (the `data_parallel` role).

    DPSyncMPClient(config)       config.data_parallel_size = N cores, each a `SyncMPClient` (its own child
                                 process, its own ZMQ sockets, the whole model: data parallelism copies the
                                 model, tensor parallelism splits it), behind `LLMEngine.step`
    DPAsyncMPClient(config)      the same behind asyncio (`AsyncMPClient`'s surface): what `AsyncLLM`'s
                                 output-handler task reads for the server (mini/engine/async_llm.py)
    add_request(_async)          DPLoadBalancer.route -> that core; the balancer counts it as waiting there
                                 until the core's next stats arrive (vLLM's client does the same between two
                                 coordinator publications)
    abort/finish_requests(_async) grouped by the core that owns each request (unknown ids are dropped)
    get_output / outputs_async   every core's EngineCoreOutputs, merged in arrival order, each tagged
                                 with its `engine_index` (the stat loggers label series with it)
    latest_scheduler_stats_per_engine   {core: its last SchedulerStats} (the server's per-core /metrics)

Load counts: vLLM runs a separate coordinator process that gathers every core's `SchedulerStats` and publishes
the whole list to the front ends about every 100 ms. mini has one front end, so it skips that process: each
core already sends its `SchedulerStats` with every step's outputs (mini/engine/core_proc.py), and the
client hands them, as those outputs leave it, straight to the balancer (`DPLoadBalancer.update_counts`). A core
with nothing to do sends nothing; its last counts were taken after its last step, and the balancer's exact
in-flight count (`engine_inflight`) covers the rest.

Death: as vLLM's `MPClientEngineMonitor`, one core's death kills the whole client. Every waiter gets
`EngineDeadError` naming the core, and the other cores are shut down at once (no orphan process, no socket
directory left). `shutdown()` stops every core; a core is also stopped when its client is garbage collected
or this process exits (each `SyncMPClient` has its own finalizer).

Where mini differs: no coordinator process and no "wave" bookkeeping (vLLM keeps idle DP ranks stepping in
lockstep for MoE's collective ops; mini's cores are independent dense models), no external or hybrid load
balancing, one front end (`client_count=1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from typing import Any

from mini import roles
from mini.config import EngineConfig
from mini.engine import EngineCoreOutput, EngineCoreRequest
from mini.engine.core_client import EngineCoreClient, SyncMPClient, step_outputs
from mini.engine.dp_routing import DPLoadBalancer
from mini.engine.exceptions import EngineDeadError
from mini.metrics.stats import SchedulerStats
from mini.serial_utils import EngineCoreOutputs

logger = logging.getLogger(__name__)

POLL_S = 0.1


class _DPClient(EngineCoreClient):
    """What both DP clients share: N cores, the balancer, routing by owner, per-core stats, death, shutdown.

    Each core is a `SyncMPClient` (its own process, sockets and output-reading thread); one forwarding thread
    per core hands its outputs to `_deliver(index, item)`, which the sync and the asyncio client implement.
    (Not N `AsyncMPClient`s: those re-bind their output socket on first asyncio use, and a core forked after
    another one holds a copy of that one's open connection, so the re-bound socket would never hear from it.)
    """

    is_multiprocess = True

    def __init__(self, config: EngineConfig) -> None:
        size = config.data_parallel_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"data_parallel_size must be a positive int, got {size!r}")
        self.config = config
        self.load_balancer: DPLoadBalancer = roles.resolve(config, DPLoadBalancer)(size)
        self.latest_scheduler_stats_per_engine: dict[int, SchedulerStats] = {}
        self.failed_requests: dict[str, str] = {}
        self.dead_message: str | None = None
        self.last_engine_index = 0     # the core whose outputs were handed out last
        self._closed = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the balancer: routed from the caller, updated as outputs arrive
        # Each core is one ordinary engine core (data parallelism lives in this front end only).
        core_config = dataclasses.replace(config, data_parallel_size=1)
        self.cores: list[SyncMPClient] = []
        try:
            for _ in range(size):
                self.cores.append(SyncMPClient(core_config))
        except BaseException:
            self.shutdown()
            raise
        startups = [core.startup for core in self.cores]
        self.startup: dict[str, Any] = dict(startups[0])
        self.startup["num_gpu_blocks_per_engine"] = [int(s["num_gpu_blocks"]) for s in startups]
        self._forwarders = [threading.Thread(target=self._forward, args=(index, core), daemon=True,
                                             name=f"mini-dp-forward-{index}")
                            for index, core in enumerate(self.cores)]

    def _start_forwarders(self) -> None:
        for thread in self._forwarders:
            thread.start()

    @property
    def data_parallel_size(self) -> int:
        return len(self.cores)

    # ------------------------------------------------------------------ outputs
    def _forward(self, index: int, core: SyncMPClient) -> None:
        """Core `index`'s outputs (or its death) -> `_deliver`, until shutdown."""
        while not self._stop.is_set():
            try:
                item = core.outputs_queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if self._stop.is_set():
                return
            if isinstance(item, BaseException):
                self._dead(index, item)     # stop the other cores now, even if nobody is reading
            self._deliver(index, item)
            if isinstance(item, BaseException):
                return

    def _deliver(self, index: int, item: EngineCoreOutputs | BaseException) -> None:
        raise NotImplementedError

    def _take(self, index: int, item: EngineCoreOutputs | BaseException) -> EngineCoreOutputs:
        """Core `index`'s next item on its way out: outputs tagged and counted; a death raised for everyone."""
        if isinstance(item, BaseException):
            raise self._dead(index, item)
        item.engine_index = index
        self.last_engine_index = index
        with self._lock:
            if item.scheduler_stats is not None:
                self._record_stats(index, item.scheduler_stats)
            finished = [o.request_id for o in item.outputs if o.finished]
            if item.failed_requests:
                finished.extend(item.failed_requests)
            if finished:
                self.load_balancer.finished(finished)
        return item

    def _record_stats(self, index: int, stats: SchedulerStats) -> None:
        self.latest_scheduler_stats_per_engine[index] = stats
        counts = [list(entry) for entry in self.load_balancer.lb_engines]
        counts[index] = [stats.num_waiting_reqs, stats.num_running_reqs, stats.kv_cache_usage]
        self.load_balancer.update_counts(counts)

    def _dead(self, index: int, error: BaseException) -> EngineDeadError:
        """One core is gone: the client is dead (vLLM's monitor) and every core stops."""
        if self.dead_message is None:
            self.dead_message = f"data-parallel engine core {index} of {len(self.cores)} failed: {error}"
            logger.error("%s; shutting down the other cores", self.dead_message)
            self._stop.set()
            self._stop_cores()
        return EngineDeadError(self.dead_message)

    def _check_alive(self) -> None:
        if self.dead_message is not None:
            raise EngineDeadError(self.dead_message)
        if self._closed:
            raise EngineDeadError("the data-parallel engine cores have been shut down")

    # ------------------------------------------------------------------ requests
    def add_request(self, request: EngineCoreRequest) -> int:
        """Send `request` to the least-loaded core; returns that core's index."""
        self._check_alive()
        with self._lock:
            index = self.load_balancer.route(request.request_id)
        try:
            self.cores[index].add_request(request)
        except BaseException:
            with self._lock:
                self.load_balancer.finished([request.request_id])
            raise
        return index

    def _by_core(self, request_ids: list[str]) -> dict[int, list[str]]:
        owners = self.load_balancer.reqs_in_flight
        groups: dict[int, list[str]] = {}
        for request_id in request_ids:
            if request_id in owners:
                groups.setdefault(owners[request_id], []).append(request_id)
        return groups

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort each request in the core that owns it (vLLM: `DPLBAsyncMPClient.abort_requests_async`);
        ids no core owns (finished, unknown) are dropped."""
        self.finish_requests(request_ids, None)

    def finish_requests(self, request_ids: list[str], status: Any) -> None:
        """Finish requests (a stop string the front end found; None: abort) in the cores that own them."""
        self._check_alive()
        with self._lock:
            groups = self._by_core(list(request_ids))
            for ids in groups.values():
                self.load_balancer.finished(ids)
        for index, ids in groups.items():
            if status is None:
                self.cores[index].abort_requests(ids)
            else:
                self.cores[index].finish_requests(ids, status)

    def engine_of(self, request_id: str) -> int | None:
        """The core a request in flight was routed to (None once it finished or was aborted)."""
        return self.load_balancer.reqs_in_flight.get(request_id)

    # ------------------------------------------------------------------ utilities and stats
    def call_utility(self, method: str, *args: Any, engine: int | None = None) -> Any:
        """A utility on one core (`engine`), or on every core: then the list of their answers."""
        self._check_alive()
        if engine is not None:
            return self.cores[engine].call_utility(method, *args)
        return [core.call_utility(method, *args) for core in self.cores]

    def get_scheduler_stats_per_engine(self) -> list[SchedulerStats]:
        self._check_alive()
        return [core.get_scheduler_stats() for core in self.cores]

    def get_scheduler_stats(self) -> SchedulerStats:
        """Every core's counters summed (KV usage: the mean); per core: `get_scheduler_stats_per_engine`."""
        return sum_scheduler_stats(self.get_scheduler_stats_per_engine())

    def reset_prefix_cache(self) -> bool:
        return all(self.call_utility("reset_prefix_cache"))

    @property
    def latest_scheduler_stats(self) -> SchedulerStats | None:
        """The last stats of the core whose outputs were handed out last (what a stat logger records for it)."""
        return self.latest_scheduler_stats_per_engine.get(self.last_engine_index)

    # ------------------------------------------------------------------ liveness and shutdown
    @property
    def pids(self) -> list[int]:
        return [core.pid for core in self.cores]

    def is_alive(self) -> bool:
        """True while every core runs (the server's /health)."""
        return (self.dead_message is None and not self._closed and bool(self.cores)
                and all(core.is_alive() for core in self.cores))

    def _stop_cores(self) -> None:
        for core in self.cores:
            try:
                core.shutdown()
            except Exception:  # keep stopping the others
                logger.exception("shutting down an engine core failed")

    def shutdown(self) -> None:
        """Stop every core (their processes and sockets) and the forwarding threads. Idempotent."""
        self._closed = True
        self._stop.set()
        self._stop_cores()


class DPSyncMPClient(_DPClient):
    """N cores for `LLMEngine`'s `step()` (the front end `AsyncLLM` drives on its thread): `get_output`."""

    def __init__(self, config: EngineConfig) -> None:
        self._merged: queue.Queue = queue.Queue()
        super().__init__(config)
        self._start_forwarders()

    def _deliver(self, index: int, item: EngineCoreOutputs | BaseException) -> None:
        self._merged.put((index, item))

    def get_output(self, timeout: float | None = None) -> EngineCoreOutputs:
        """The next EngineCoreOutputs of any core (`engine_index` says which); an empty one after `timeout`
        seconds; EngineDeadError once any core died."""
        self._check_alive()
        try:
            index, item = self._merged.get(timeout=timeout)
        except queue.Empty:
            self._check_alive()
            return EngineCoreOutputs()
        return self._take(index, item)

    def has_unfinished_requests(self) -> bool:
        return bool(self.load_balancer.reqs_in_flight)


class DPAsyncMPClient(_DPClient):
    """N cores for an asyncio front end (vLLM's DPLBAsyncMPClient): the surface of `AsyncMPClient`."""

    def __init__(self, config: EngineConfig) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._merged: asyncio.Queue | None = None
        super().__init__(config)

    def _ensure_started(self) -> None:
        """On first use from a loop: outputs go to an asyncio queue of that loop."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError("a DPAsyncMPClient serves one event loop")
        self._loop, self._merged = loop, asyncio.Queue()
        self._start_forwarders()

    def _deliver(self, index: int, item: EngineCoreOutputs | BaseException) -> None:
        with contextlib.suppress(RuntimeError):   # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(self._merged.put_nowait, (index, item))

    async def outputs_async(self) -> EngineCoreOutputs:
        """The next EngineCoreOutputs of any core (its `engine_index` says which); EngineDeadError once dead."""
        self._ensure_started()
        self._check_alive()
        index, item = await self._merged.get()
        try:
            return self._take(index, item)
        except EngineDeadError:
            self._merged.put_nowait((index, item))   # every later call fails the same way
            raise

    async def get_output_async(self) -> list[EngineCoreOutput]:
        """The next step's outputs of any core; a step that failed raises EngineStepError for its requests."""
        return step_outputs(await self.outputs_async(), self.failed_requests)

    async def add_request_async(self, request: EngineCoreRequest) -> int:
        self._ensure_started()
        return self.add_request(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._ensure_started()
        self.abort_requests(list(request_ids))

    async def finish_requests_async(self, request_ids: list[str], status: Any) -> None:
        self._ensure_started()
        self.finish_requests(list(request_ids), status)

    async def call_utility_async(self, method: str, *args: Any, engine: int | None = None) -> Any:
        """`call_utility` off the event loop (each core answers on its own output thread)."""
        self._ensure_started()
        return await asyncio.to_thread(self.call_utility, method, *args, engine=engine)

    async def get_scheduler_stats_per_engine_async(self) -> list[SchedulerStats]:
        return await asyncio.to_thread(self.get_scheduler_stats_per_engine)

    async def get_scheduler_stats_async(self) -> SchedulerStats:
        return sum_scheduler_stats(await self.get_scheduler_stats_per_engine_async())

    async def reset_prefix_cache_async(self) -> bool:
        return all(await self.call_utility_async("reset_prefix_cache"))


def make_dp_client(multiprocess_mode: bool, config: EngineConfig,
                   asyncio_mode: bool = False) -> _DPClient:
    """`LLMEngine`'s client when `config.data_parallel_size > 1`: the cores are processes, so the switch must be on.
    `asyncio_mode`: a `DPAsyncMPClient` (AsyncLLM's output-handler task reads it)."""
    if not multiprocess_mode:
        from mini.engine.core_client import ENV_MULTIPROCESSING

        raise ValueError(f"data_parallel_size={config.data_parallel_size} runs one engine-core process per rank; "
                         f"it cannot run with {ENV_MULTIPROCESSING}=0 (in process)")
    return DPAsyncMPClient(config) if asyncio_mode else DPSyncMPClient(config)


def engine_cores_alive(async_llm: Any) -> bool:
    """False once any engine core behind `async_llm` (an AsyncLLM) has died, even while it is idle (/health)."""
    core_client = getattr(getattr(async_llm, "engine", None), "engine_core", None)
    is_alive = getattr(core_client, "is_alive", None)
    return bool(is_alive()) if callable(is_alive) else True


def dp_stat_logger_args(async_llm: Any) -> dict[str, Any]:
    """PrometheusStatLogger's per-core arguments for `async_llm` (an AsyncLLM): {} with one engine core."""
    core_client = getattr(getattr(async_llm, "engine", None), "engine_core", None)
    if not isinstance(core_client, _DPClient):
        return {}
    return {"engine_indexes": list(range(core_client.data_parallel_size)),
            "engine_index_of": lambda: core_client.last_engine_index}


def sum_scheduler_stats(per_engine: list[SchedulerStats]) -> SchedulerStats:
    """One SchedulerStats for all cores (vLLM's aggregated logger): ints and int lists summed (nested stats
    too), floats (the KV-cache usage) averaged."""
    if not per_engine:
        raise ValueError("sum_scheduler_stats needs at least one SchedulerStats")
    return _combine(per_engine)


def _combine(values: list[Any]) -> Any:
    first = values[0]
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{f.name: _combine([getattr(v, f.name) for v in values])
                                             for f in dataclasses.fields(first)})
    if isinstance(first, bool):
        return first
    if isinstance(first, int):
        return sum(values)
    if isinstance(first, float):
        return sum(values) / len(values)
    if isinstance(first, list):
        width = max(len(v) for v in values)
        return [sum(v[i] for v in values if i < len(v)) for i in range(width)]
    return first


__all__ = ["DPAsyncMPClient", "DPSyncMPClient", "dp_stat_logger_args", "engine_cores_alive", "make_dp_client",
           "sum_scheduler_stats"]
