"""The OpenAI server with `data_parallel_size=2`: two engine cores behind one front end (mini/engine/dp_client.py).

Concurrent streaming completions are served, greedy texts equal one core's; /metrics has one series per core
(`engine="0"`, `engine="1"`) and both cores did work; killing one core turns /health to 503, fails requests
with 503, and leaves no engine-core process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.engine.async_llm import AsyncLLM
from mini.engine.dp_client import DPAsyncMPClient
from mini.entrypoints.openai.api_server import build_app, serve_in_thread
from tests.engine.test_core_death import _alive, _wait_gone

MODEL = "tiny-llama"
PROMPTS = ["Hello world", "The cat", "Once upon a time", "1 2 3", "In the beginning", "Roses are red"]
MAX_TOKENS = 8
ENGINE_ARGS = {"num_gpu_blocks_override": 64, "max_num_seqs": 4}
SAFETY_S = HANG_GUARD_S   # a safety net for waits, never an assertion on speed


@pytest.fixture(scope="module")
def reference_texts():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(**ENGINE_ARGS)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [out.outputs[0].text for out in outs]


async def _stream(client, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    text = ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                text += "".join(choice["text"] for choice in chunk["choices"])
    return text


async def _all(url: str) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=SAFETY_S) as client:
        return list(await asyncio.gather(*(_stream(client, p) for p in PROMPTS)))


def _metrics(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_two_cores_behind_one_server(reference_texts, monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")   # DP cores are processes, whatever the suite's mode
    engine = AsyncLLM.from_engine_args(data_parallel_size=2, **ENGINE_ARGS)
    client = engine.engine.engine_core
    assert isinstance(client, DPAsyncMPClient)   # read by the output-handler task
    pids = client.pids
    try:
        with serve_in_thread(build_app(engine, MODEL)) as url:
            assert httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 200
            assert asyncio.run(_all(url)) == reference_texts       # greedy: the same text as one core

            values = _metrics(url)
            for core in ("0", "1"):
                label = f'{{engine="{core}",model_name="{MODEL}"}}'
                assert values[f"mini:generation_tokens_total{label}"] > 0, f"core {core} served nothing"
                assert f"mini:num_requests_running{label}" in values
                assert f"mini:kv_cache_usage_perc{label}" in values
            assert sum(v for k, v in values.items() if k.startswith("mini:generation_tokens_total")) \
                == MAX_TOKENS * len(PROMPTS)
            assert client.load_balancer.engine_inflight == [0, 0]

            # one core dies: the server is unhealthy at once, requests fail with 503, the other core stops too
            os.kill(pids[1], signal.SIGKILL)
            deadline = time.monotonic() + SAFETY_S
            while httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 503
            response = httpx.post(f"{url}/v1/completions", timeout=SAFETY_S,
                                  json={"model": MODEL, "prompt": "Hi", "max_tokens": 4})
            assert response.status_code == 503, response.text
            assert "data-parallel engine core 1 of 2" in response.json()["error"]["message"]
            for pid in pids:
                assert _wait_gone(pid), f"engine core {pid} outlived its dead sibling"
    finally:
        engine.shutdown()
    assert not any(_alive(pid) for pid in pids)


def test_prometheus_logger_one_series_per_engine():
    from mini.engine.async_llm import IterationStats
    from mini.entrypoints.openai.metrics import PrometheusStatLogger
    from mini.metrics.stats import SchedulerStats

    current = [1]
    logger = PrometheusStatLogger(MODEL, engine_indexes=[0, 1], engine_index_of=lambda: current[0])
    stats = SchedulerStats(step=1, num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.5, num_preemptions=0)
    logger(stats, IterationStats(num_generation_tokens=5))
    logger.record(stats, IterationStats(num_generation_tokens=2), engine_idx=0)
    text = logger.render().decode()
    assert f'mini:generation_tokens_total{{engine="1",model_name="{MODEL}"}} 5.0' in text
    assert f'mini:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 2.0' in text
    assert f'mini:num_requests_running{{engine="1",model_name="{MODEL}"}} 3.0' in text
    with pytest.raises(ValueError, match="engine_idx 2"):
        logger.record(stats, IterationStats(), engine_idx=2)
    single = PrometheusStatLogger(MODEL).render().decode()   # one engine: no engine label, as before
    assert f'mini:num_requests_running{{model_name="{MODEL}"}}' in single and "engine=" not in single
