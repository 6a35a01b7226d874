"""Engine-core clients (mini/engine/core_client.py): the switch, AsyncMPClient under phase 13's output handler
and generate_stream, AsyncLLM streaming over a child-process core, spawn's picklability check, a course part
reaching a forked core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.engine.async_llm import AsyncLLM, generate_stream, output_handler_step
from mini.engine.core_client import (
    AsyncInprocClient,
    AsyncMPClient,
    EngineCoreClient,
    InprocClient,
    multiprocessing_enabled,
)
from mini.engine.exceptions import EngineDeadError
from mini.engine.input_processor import InputProcessor
from mini.engine.output_processor import OutputProcessor
from mini.engine.utils import _check_picklable
from mini.sampling_params import RequestOutputKind
from mini.tokenizer import load_tokenizer

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

CONFIG = EngineConfig(num_gpu_blocks_override=64, max_num_seqs=4)


def test_the_switch(monkeypatch):
    monkeypatch.delenv("MINI_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert multiprocessing_enabled()
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
    assert not multiprocessing_enabled()
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "maybe")
    with pytest.raises(ValueError, match="MINI_ENABLE_V1_MULTIPROCESSING must be 0 or 1"):
        multiprocessing_enabled()
    client = EngineCoreClient.make_client(False, True, CONFIG)   # AsyncLLM in process: the core on a thread
    try:
        assert isinstance(client, AsyncInprocClient) and client.is_alive() and not client.is_multiprocess
    finally:
        client.shutdown()
    assert not client.is_alive()


@pytest.fixture(scope="module")
def greedy_reference():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(num_gpu_blocks_override=64, max_num_seqs=4)
    assert isinstance(llm.llm_engine.engine_core, InprocClient)
    outs = llm.generate(["Hello world", "The cat"], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    return {"a": list(outs[0].outputs[0].token_ids), "b": list(outs[1].outputs[0].token_ids)}


def _request(processor: InputProcessor, request_id: str, prompt: str, max_tokens: int):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)
    return processor.process(request_id, prompt, params, arrival_time=0.0)


def test_the_core_keeps_a_thread_for_a_front_end_that_works_while_it_steps(monkeypatch):
    """`LLM`'s core (a SyncMPClient from make_client) takes every torch thread: its front end waits while it steps,
    whether it schedules asynchronously or not. The server's (AsyncMPClient) and a data-parallel core keep one for
    the front end (at least 1 for the core)."""
    import torch

    from mini.engine import utils as engine_utils

    monkeypatch.delenv(engine_utils.ENV_CORE_THREADS, raising=False)
    threads = torch.get_num_threads()
    assert engine_utils._torch_threads(0) == threads
    assert engine_utils._torch_threads(1) == max(1, threads - 1)
    asked: list[int] = []
    real = engine_utils._torch_threads
    monkeypatch.setattr(engine_utils, "_torch_threads", lambda keep=1: asked.append(keep) or real(keep))
    for asyncio_mode in (False, True):
        EngineCoreClient.make_client(True, asyncio_mode, CONFIG).shutdown()
    assert asked == [0, 1]
    # An async-scheduling core too: its two threads take turns with the pool (mini/system_utils.py).
    EngineCoreClient.make_client(True, False, EngineConfig(num_gpu_blocks_override=64, max_num_seqs=4,
                                                           async_scheduling=True)).shutdown()
    assert asked == [0, 1, 0]
    monkeypatch.setenv(engine_utils.ENV_CORE_THREADS, "3")
    assert real(0) == real(1) == 3


def test_async_mp_client_under_phase13_output_handler(greedy_reference):
    """vLLM's AsyncLLM shape over a real child-process core: output handler task + per-request streams;
    a consumer that goes away aborts its request, whose blocks the core frees."""

    async def main() -> None:
        client = AsyncMPClient(CONFIG)
        try:
            tokenizer = load_tokenizer(CONFIG.model_dir)
            info = client.startup
            processor = InputProcessor(tokenizer, info["vocab_size"], info["max_model_len"], info["eos_token_id"])
            output_processor = OutputProcessor(tokenizer)
            collectors: dict = {}
            free_before = await client.call_utility_async("get_num_free_blocks")

            async def handler() -> None:
                while True:
                    await output_handler_step(client, output_processor, collectors)

            task = asyncio.create_task(handler())
            tokens: list[int] = []
            async for out in generate_stream(client, output_processor, collectors,
                                             _request(processor, "a", "Hello world", 12)):
                tokens += out.outputs[0].token_ids
            assert tokens == greedy_reference["a"]

            stream = generate_stream(client, output_processor, collectors,
                                     _request(processor, "long", "The cat", 400))
            await stream.__anext__()
            await stream.aclose()          # the consumer leaves: the request is aborted in the core
            for _ in range(100):
                if await client.call_utility_async("get_num_free_blocks") == free_before:
                    break
                await asyncio.sleep(0.05)
            assert await client.call_utility_async("get_num_free_blocks") == free_before
            assert (await client.get_scheduler_stats_async()).num_running_reqs == 0
            task.cancel()
            os.kill(client.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(client.get_output_async(), HANG_GUARD_S)
        finally:
            client.shutdown()

    asyncio.run(main())


def test_async_llm_streams_over_a_child_process_core(monkeypatch, greedy_reference):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    stats = []
    engine = AsyncLLM(CONFIG, stat_loggers=[lambda scheduler_stats, iteration: stats.append(scheduler_stats)])
    assert engine.engine.multiprocess_mode
    pid = engine.engine.engine_core.pid

    async def main() -> list[int]:
        tokens: list[int] = []
        params = SamplingParams(temperature=0.0, max_tokens=12, output_kind=RequestOutputKind.DELTA)
        async for out in engine.generate("Hello world", params, request_id="s"):
            tokens += out.outputs[0].token_ids
        assert (await engine.get_scheduler_stats()).num_running_reqs == 0
        return tokens

    try:
        assert asyncio.run(main()) == greedy_reference["a"]
        assert stats and stats[-1].num_running_reqs <= 1
    finally:
        engine.shutdown()
    from tests.engine.test_core_death import _wait_gone

    assert _wait_gone(pid), f"the engine core {pid} outlived AsyncLLM.shutdown()"


def test_spawn_needs_picklable_parts(monkeypatch):
    plugged = dataclasses.replace(CONFIG, parts={"allocate_slots": lambda *args, **kwargs: None})
    with pytest.raises(TypeError, match="MINI_ENABLE_V1_MULTIPROCESSING=0"):
        _check_picklable(plugged)
    monkeypatch.setenv("MINI_WORKER_MULTIPROC_METHOD", "spawn")
    with pytest.raises(TypeError, match="spawn"):
        EngineCoreClient.make_client(True, False, plugged)
    _check_picklable(CONFIG)   # the default engine pickles fine


def test_a_course_part_reaches_a_forked_core(monkeypatch, tmp_path, greedy_reference):
    """The course plugs a learner's function into the engine (mini.roles); fork carries it to the core's
    process, a closure too (spawn could not pickle it)."""
    from mini.core.kv_cache_manager import KVCacheManager
    from mini.engine.llm_engine import LLMEngine

    marker = tmp_path / "pids"
    reference = KVCacheManager.allocate_slots

    def learner_allocate_slots(self, *args, **kwargs):
        with marker.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return reference(self, *args, **kwargs)

    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("MINI_WORKER_MULTIPROC_METHOD", "fork")
    engine = LLMEngine(CONFIG, parts={"allocate_slots": learner_allocate_slots})
    try:
        engine.add_request("a", "Hello world", SamplingParams(temperature=0.0, max_tokens=12))
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens = list(out.outputs[0].token_ids)
        assert tokens == greedy_reference["a"]
        assert set(marker.read_text().split()) == {str(engine.engine_core.pid)}
    finally:
        engine.shutdown()


def test_the_front_end_loads_its_tokenizer_while_the_core_starts(monkeypatch, greedy_reference):
    """`while_starting` runs after the child process is started and before its handshake (so the two start-ups
    overlap): LLMEngine's tokenizer is what it returned. If it fails, the child is shut down, not left behind."""
    import multiprocessing

    from mini.engine import core_client

    monkeypatch.delenv("MINI_ENABLE_V1_MULTIPROCESSING", raising=False)
    events: list[str] = []
    real_wait = core_client.MPClient._wait_for_handshake
    monkeypatch.setattr(core_client.MPClient, "_wait_for_handshake",
                        lambda self: events.append("handshake") or real_wait(self))

    def cores() -> list:
        return [p for p in multiprocessing.active_children() if p.name == "mini-engine-core"]

    def alongside():
        events.append(f"alongside, {len(cores())} core running")
        return "the tokenizer"

    client = EngineCoreClient.make_client(True, False, CONFIG, while_starting=alongside)
    try:
        assert events == ["alongside, 1 core running", "handshake"]
        assert client.started_alongside == "the tokenizer"
    finally:
        client.shutdown()

    def broken():
        raise OSError("no tokenizer here")

    with pytest.raises(OSError, match="no tokenizer here"):
        EngineCoreClient.make_client(True, False, CONFIG, while_starting=broken)
    assert cores() == [], "the core started before the failure was left running"

    llm = LLM(num_gpu_blocks_override=64, max_num_seqs=4)
    try:
        engine = llm.llm_engine
        assert engine.engine_core.is_multiprocess and engine.tokenizer is engine.engine_core.started_alongside
        out = llm.generate(["Hello world"], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
        assert list(out[0].outputs[0].token_ids) == greedy_reference["a"]
    finally:
        llm.llm_engine.engine_core.shutdown()
