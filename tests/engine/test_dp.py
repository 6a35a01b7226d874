"""Data parallelism (mini/engine/dp_client.py): N engine cores behind one front end.

The routing rule through its pure function (mini/engine/dp_routing.py); the config's validation and the
offline refusal; DP=2 under phase 13's output handler: greedy tokens identical to one core, requests on both
cores, an abort freeing the blocks of the core that owns the request, a killed core failing every waiter
with EngineDeadError and leaving no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.engine.async_llm import generate_stream, output_handler_step
from mini.engine.core_client import InprocClient
from mini.engine.dp_client import DPAsyncMPClient, sum_scheduler_stats
from mini.engine.dp_routing import DPLoadBalancer, get_core_engine_for_request
from mini.engine.exceptions import EngineDeadError
from mini.engine.input_processor import InputProcessor
from mini.engine.llm_engine import LLMEngine
from mini.engine.output_processor import OutputProcessor
from mini.metrics.stats import SchedulerStats
from mini.sampling_params import RequestOutputKind
from mini.tokenizer import load_tokenizer
from tests.engine.test_core_death import _alive, _wait_gone

CONFIG = EngineConfig(num_gpu_blocks_override=64, max_num_seqs=4, data_parallel_size=2)
PROMPTS = {"a": "Hello world", "b": "The cat", "c": "Once upon a time", "d": "1 2 3"}
MAX_TOKENS = 8
SAFETY_S = HANG_GUARD_S   # a safety net for waits, never an assertion on speed


# ---------------------------------------------------------------------------- the rule and the config
def test_least_loaded_core_wins_and_ties_rotate():
    # waiting + running, or this client's in-flight count when larger
    assert get_core_engine_for_request([[2, 3], [0, 1]], [0, 0]) == 1
    assert get_core_engine_for_request([[0, 0], [0, 0]], [3, 1]) == 1
    # a tie goes to the first core the scan reaches
    assert get_core_engine_for_request([[1, 1], [1, 1]], [0, 0], eng_start_index=1) == 1
    balancer = DPLoadBalancer(2)
    routed = [balancer.route(f"r{i}") for i in range(4)]
    assert sorted(routed) == [0, 0, 1, 1]              # no stats yet: the in-flight counts spread them
    balancer.finished(["r0", "r2"])
    assert balancer.engine_inflight == [[routed[1], routed[3]].count(0), [routed[1], routed[3]].count(1)]
    assert balancer.route("r9", data_parallel_rank=1) == 1      # an explicit rank is honoured


def test_data_parallel_size_is_validated_and_refused_offline(monkeypatch):
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="data_parallel_size must be a positive int"):
            EngineConfig(data_parallel_size=bad)
    with pytest.raises(ValueError, match="data_parallel_size=2.*one LLM per process"):
        LLM(data_parallel_size=2, num_gpu_blocks_override=16)
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")   # DP cores are processes: in-process is refused
    with pytest.raises(ValueError, match="MINI_ENABLE_V1_MULTIPROCESSING=0"):
        LLMEngine(EngineConfig(data_parallel_size=2, num_gpu_blocks_override=16))


def test_summed_scheduler_stats():
    a = SchedulerStats(step=3, num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5, num_preemptions=1)
    b = SchedulerStats(step=5, num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.25, num_preemptions=0)
    total = sum_scheduler_stats([a, b])
    assert (total.num_running_reqs, total.num_waiting_reqs, total.num_preemptions) == (3, 1, 1)
    assert total.kv_cache_usage == pytest.approx(0.375)


# ---------------------------------------------------------------------------- two cores
@pytest.fixture(scope="module")
def greedy_reference():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(num_gpu_blocks_override=64, max_num_seqs=4)
    assert isinstance(llm.llm_engine.engine_core, InprocClient)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate(list(PROMPTS.values()), params, use_tqdm=False)
    return {key: list(out.outputs[0].token_ids) for key, out in zip(PROMPTS, outs, strict=True)}


def _front_end(client: DPAsyncMPClient):
    tokenizer = load_tokenizer(CONFIG.model_dir)
    info = client.startup
    processor = InputProcessor(tokenizer, info["vocab_size"], info["max_model_len"], info["eos_token_id"])
    return processor, OutputProcessor(tokenizer)


def _request(processor: InputProcessor, request_id: str, prompt: str, max_tokens: int):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)
    return processor.process(request_id, prompt, params, arrival_time=0.0)


def test_two_cores_serve_concurrent_streams_identically_and_route_aborts(greedy_reference):
    async def main() -> None:
        client = DPAsyncMPClient(CONFIG)
        pids = client.pids
        assert len(set(pids)) == 2
        try:
            processor, output_processor = _front_end(client)
            collectors: dict = {}
            seen_engines: set[int] = set()
            free_before = await client.call_utility_async("get_num_free_blocks")
            assert len(free_before) == 2

            async def handler() -> None:
                while True:
                    await output_handler_step(client, output_processor, collectors)

            async def one(key: str) -> list[int]:
                tokens: list[int] = []
                request = _request(processor, key, PROMPTS[key], MAX_TOKENS)
                async for out in generate_stream(client, output_processor, collectors, request):
                    if client.engine_of(key) is not None:
                        seen_engines.add(client.engine_of(key))
                    tokens += out.outputs[0].token_ids
                return tokens

            task = asyncio.create_task(handler())
            results = await asyncio.wait_for(asyncio.gather(*(one(k) for k in PROMPTS)), SAFETY_S)
            assert dict(zip(PROMPTS, results, strict=True)) == greedy_reference
            assert seen_engines == {0, 1}, "both cores should have served requests"
            assert set(client.latest_scheduler_stats_per_engine) == {0, 1}
            assert client.load_balancer.engine_inflight == [0, 0]

            # an abort goes to the core that owns the request and frees its blocks there
            stream = generate_stream(client, output_processor, collectors, _request(processor, "long", "The cat", 400))
            await asyncio.wait_for(stream.__anext__(), SAFETY_S)
            owner = client.engine_of("long")
            assert owner in (0, 1)
            assert (await client.call_utility_async("get_num_free_blocks", engine=owner)) < free_before[owner]
            await stream.aclose()
            assert client.engine_of("long") is None
            for _ in range(200):
                if await client.call_utility_async("get_num_free_blocks") == free_before:
                    break
                await asyncio.sleep(0.05)
            assert await client.call_utility_async("get_num_free_blocks") == free_before
            assert (await client.get_scheduler_stats_async()).num_running_reqs == 0
            task.cancel()
        finally:
            client.shutdown()
        for pid in pids:
            assert _wait_gone(pid), f"engine core {pid} outlived shutdown()"

    asyncio.run(main())


def test_a_killed_core_kills_the_client_and_leaves_no_process():
    async def main() -> None:
        client = DPAsyncMPClient(CONFIG)
        pids = client.pids
        try:
            processor, output_processor = _front_end(client)
            collectors: dict = {}
            stream = generate_stream(client, output_processor, collectors, _request(processor, "x", "Hi", 400))
            handler = asyncio.create_task(_handle_forever(client, output_processor, collectors))
            await asyncio.wait_for(stream.__anext__(), SAFETY_S)
            victim = 1 - client.engine_of("x")      # kill the core that does NOT hold the request
            os.kill(pids[victim], signal.SIGKILL)
            with pytest.raises(EngineDeadError, match=f"engine core {victim} of 2"):
                await asyncio.wait_for(handler, SAFETY_S)
            assert not client.is_alive()
            with pytest.raises(EngineDeadError):
                await client.add_request_async(_request(processor, "y", "Hi", 4))
            with contextlib.suppress(EngineDeadError):
                await stream.aclose()
            # the surviving core was shut down with it: no orphan
            for pid in pids:
                assert _wait_gone(pid), f"engine core {pid} outlived its dead sibling"
        finally:
            client.shutdown()
        assert not any(_alive(pid) for pid in pids)

    asyncio.run(main())


async def _handle_forever(client, output_processor, collectors) -> None:
    while True:
        await output_handler_step(client, output_processor, collectors)
