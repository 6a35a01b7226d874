"""/metrics gauges say the engine's state now, also once it is idle (issue 40).

The stat loggers hear from the engine after each step. Requests that end by an abort (their clients went away,
as a fuzzer's do) end between steps, and an idle engine takes no further step: without a refresh the gauges
kept the last step's counts ("running=64, waiting=3457 long after a fuzz run ended") until a new request
stepped the engine. A scrape now asks the engine first
(mini/entrypoints/openai/metrics.py `refresh_gauges`).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, serve_in_thread

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
LABEL = f'{{model_name="{MODEL}"}}'


def scrape(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_gauges_are_zero_once_a_burst_has_ended():
    engine = AsyncLLM.from_engine_args(max_num_seqs=2, max_model_len=64)
    with serve_in_thread(build_app(engine, MODEL)) as url:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.0, "ignore_eos": True}

        def send(_: int) -> int:
            return httpx.post(f"{url}/v1/completions", json=body, timeout=HANG_GUARD_S).status_code

        with ThreadPoolExecutor(6) as pool:     # more than max_num_seqs: some wait, all finish
            assert list(pool.map(send, range(6))) == [200] * 6
        values = scrape(url)
        assert values[f"mini:generation_tokens_total{LABEL}"] >= 36   # the burst was recorded
        assert values[f"mini:num_requests_running{LABEL}"] == 0
        assert values[f"mini:num_requests_waiting{LABEL}"] == 0
        assert values[f"mini:kv_cache_usage_perc{LABEL}"] == 0.0


def test_gauges_are_zero_once_disconnected_streams_are_aborted():
    engine = AsyncLLM.from_engine_args(max_num_seqs=2, max_model_len=1024)
    with serve_in_thread(build_app(engine, MODEL)) as url:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0.0,
                "ignore_eos": True, "stream": True}

        def start_and_drop(_: int) -> int:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=HANG_GUARD_S) as response:
                next(response.iter_lines())     # the stream runs; then the client goes away
                return response.status_code

        with ThreadPoolExecutor(4) as pool:     # more than max_num_seqs: two run, two wait
            assert list(pool.map(start_and_drop, range(4))) == [200] * 4
        deadline = time.monotonic() + HANG_GUARD_S
        while True:     # the aborts reach the engine core
            stats = asyncio.run(engine.get_scheduler_stats())
            if stats.num_running_reqs == stats.num_waiting_reqs == 0:
                break
            assert time.monotonic() < deadline, "the dropped streams were never aborted"
            time.sleep(0.05)
        values = scrape(url)
        assert values[f"mini:generation_tokens_total{LABEL}"] >= 2   # the streams were recorded
        assert values[f"mini:num_requests_running{LABEL}"] == 0
        assert values[f"mini:num_requests_waiting{LABEL}"] == 0
        assert values[f"mini:kv_cache_usage_perc{LABEL}"] == 0.0
