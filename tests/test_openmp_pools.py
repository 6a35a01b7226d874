"""GNU OpenMP pools and the engine's threads and processes (mini/system_utils.py).

libgomp keeps one pool of worker threads per thread that ran a parallel region. A pool is visible as OS threads
of this process, so "would releasing the calling thread's pool free a thread now?" tells whether that thread
still holds one. Each test asks it at the moment the engine should have given the pool back: at the fork of
the engine-core process, and, in process with async scheduling, on the core's thread while the worker thread
steps and on the worker thread once it has no step left. Without those releases libgomp throttles every
parallel region (two pools outnumber the cores; module docstring of mini/system_utils.py), and a core forked
with the parent's pool hangs or throttles.
"""

from __future__ import annotations

import multiprocessing.context
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.engine.core_client import EngineCoreClient
from mini.engine.llm_engine import LLMEngine
from mini.system_utils import loaded_libgomp_paths, release_libgomp_threads

pytestmark = pytest.mark.skipif(not loaded_libgomp_paths() or not os.path.isdir("/proc/self/task"),
                                reason="torch here does not run on GNU OpenMP (Linux)")

CONFIG = EngineConfig(num_gpu_blocks_override=64, max_num_seqs=4)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_freed_by_releasing_now(wait_s: float = 0.5) -> int:
    """Release the calling thread's pool; how many OS threads went (its workers exit just after the call)."""
    before = _tasks()
    release_libgomp_threads()
    deadline = time.monotonic() + wait_s
    fewest = _tasks()
    while fewest == before and time.monotonic() < deadline:
        time.sleep(0.01)
        fewest = min(fewest, _tasks())
    return before - fewest


def run_a_parallel_region() -> None:
    torch.ones(1 << 21).exp_()   # far above at::parallel_for's grain size: runs on the calling thread's pool


@pytest.fixture
def two_torch_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)     # new threads (the engine's worker thread) take this count too
    yield
    torch.set_num_threads(previous)


PROBE_SCRIPT = """
import os, sys, time
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import test_openmp_pools as pools
torch.set_num_threads(2)
pools.run_a_parallel_region()
first = pools.threads_freed_by_releasing_now()
second = pools.threads_freed_by_releasing_now(wait_s=0.2)
print(first, second)
"""


def test_the_probe_sees_a_pool():
    """The measure itself: a thread that ran a parallel region holds a pool (1 worker for 2 threads); released,
    it holds none. In a fresh process: in this one, any other thread that ends meanwhile (an engine's, from an
    earlier test) would count as freed."""
    result = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "0"], result.stdout


def test_the_pause_functions_are_looked_up_once(two_torch_threads, monkeypatch):
    """An async engine may release at every step: /proc/self/maps is read once, not at each release."""
    from mini import system_utils

    assert system_utils.libgomp_pause_functions()           # found (and kept) on a Linux torch

    def no_second_scan() -> set[str]:
        raise AssertionError("read /proc/self/maps again")

    monkeypatch.setattr(system_utils, "loaded_libgomp_paths", no_second_scan)
    run_a_parallel_region()
    assert threads_freed_by_releasing_now() == 1


def test_the_engine_core_is_forked_without_the_parents_pool(two_torch_threads, monkeypatch):
    """vLLM's `_release_libgomp_threads` before a fork: the parent's pool is gone when the child starts."""
    at_fork: list[int] = []
    start = multiprocessing.context.ForkProcess.start

    def start_and_look(process):
        at_fork.append(threads_freed_by_releasing_now(wait_s=0.2))
        return start(process)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", start_and_look)
    monkeypatch.delenv("MINI_WORKER_MULTIPROC_METHOD", raising=False)
    run_a_parallel_region()   # a parent that computed something first: a notebook, the bench's peer
    client = EngineCoreClient.make_client(True, False, CONFIG)
    try:
        assert at_fork == [0], "the parent still held its OpenMP pool when it forked the engine core"
        assert client.is_multiprocess
    finally:
        client.shutdown()


def test_in_process_async_scheduling_has_one_pool_at_a_time(two_torch_threads, monkeypatch):
    """The core's thread gives its pool up when the worker thread takes the steps over, and the worker thread
    gives its own up when it has no step left (a second engine on this process then runs unthrottled)."""
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(num_gpu_blocks_override=64, max_num_seqs=4, async_scheduling=True)
    try:
        run_a_parallel_region()   # this thread (the engine core's, in process) holds a pool before the run
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}], params, use_tqdm=False)
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        assert threads_freed_by_releasing_now(wait_s=0.2) == 0, "the core's thread kept its pool while the steps ran"
        on_worker = executor.step_thread.submit(threads_freed_by_releasing_now).result(timeout=HANG_GUARD_S)
        assert on_worker == 0, "the worker thread kept its pool after its last step"
        # The control: the same question on the worker thread right after it ran a region is answered 1.
        executor.step_thread.submit(run_a_parallel_region).result(timeout=HANG_GUARD_S)
        assert executor.step_thread.submit(threads_freed_by_releasing_now).result(timeout=HANG_GUARD_S) == 1
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_the_in_process_async_llm_loop_takes_the_forwards_without_the_builders_pool(two_torch_threads,
                                                                                      monkeypatch):
    """AsyncLLM in process: the thread that built the engine (and its pool) hands the forwards to the loop."""
    from mini.engine.async_llm import AsyncLLM

    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
    engine = LLMEngine(CONFIG)
    run_a_parallel_region()
    async_llm = AsyncLLM(engine=engine)
    try:
        assert threads_freed_by_releasing_now(wait_s=0.2) == 0, "the builder's pool outlived the hand-over"
    finally:
        async_llm.shutdown()


def test_the_in_process_async_llm_loop_gives_its_pool_back_when_idle(monkeypatch):
    """Between bursts the loop thread releases its pool (a caller computing meanwhile would be throttled)."""
    import asyncio

    from mini.engine import async_llm as async_llm_module
    from mini.engine import core_client

    calls: list[str] = []
    real = core_client.release_libgomp_threads

    def recording() -> None:
        calls.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(core_client, "release_libgomp_threads", recording)   # the in-process client's thread
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
    engine = async_llm_module.AsyncLLM(CONFIG)
    try:
        assert calls == [threading.current_thread().name]          # the hand-over, on the building thread

        async def one_request(request_id: str) -> None:
            params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
            async for _ in engine.generate({"prompt_token_ids": [5, 6, 7]}, params, request_id):
                pass

        asyncio.run(one_request("a"))
        deadline = time.monotonic() + HANG_GUARD_S
        while calls.count("mini-engine-loop") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls.count("mini-engine-loop") == 1, calls      # once idle after the burst, not at every poll
        time.sleep(0.3)
        asyncio.run(one_request("b"))
        deadline = time.monotonic() + HANG_GUARD_S
        while calls.count("mini-engine-loop") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls.count("mini-engine-loop") == 2, calls
    finally:
        engine.shutdown()
