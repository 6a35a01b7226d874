"""/health keeps answering while a 5 MB prompt is tokenized and a huge `choice` list is compiled (issue 40).

Both used to run on the event loop: a 5 MB prompt froze every stream and /health for 6.5 s, a 30,000-entry
`choice` list for 2.5 s. Now tokenizing runs on the renderer's thread (mini/entrypoints/openai/renderer.py)
and the engine's input processing (the grammar check) on the engine's input thread (multiprocess) or its
engine thread (in process).

The bound, without a wall-clock limit (tests/patience.py): /health is asked again and again while the heavy
request is in flight, and the test counts the answers that came back *before the heavy request was answered*.
A loop frozen for the whole heavy request answers none of them in time (they queue behind it); a free loop
answers many. The longest single /health wait must also be under half of the heavy request's own duration:
relative to the work, so a loaded machine slows both alike.
"""

from __future__ import annotations

import threading
import time

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
FIVE_MB_PROMPT = "once upon a time " * (5_000_000 // 17)
MANY_CHOICES = [f"choice number {i}" for i in range(30_000)]
MIN_HEALTH_ANSWERS = 3


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM.from_engine_args(max_num_seqs=4, max_model_len=64)
    with serve_in_thread(build_app(engine, MODEL)) as url:
        yield url


def health_while(url: str, heavy_body: dict) -> tuple[httpx.Response, list[float], float]:
    """Send the heavy request on a thread; meanwhile ask /health in a loop.

    -> (heavy response, the latencies of the /health answers received before it, its own duration)."""
    result: dict[str, object] = {}
    done = threading.Event()

    def heavy() -> None:
        started = time.monotonic()
        try:
            result["response"] = httpx.post(f"{url}/v1/completions", json=heavy_body, timeout=HANG_GUARD_S)
        finally:
            result["duration"] = time.monotonic() - started
            done.set()

    thread = threading.Thread(target=heavy, daemon=True)
    thread.start()
    latencies = []
    with httpx.Client(timeout=HANG_GUARD_S) as client:
        while not done.is_set():
            asked = time.monotonic()
            status = client.get(f"{url}/health").status_code
            if done.is_set():
                break   # answered after the heavy request: does not count
            assert status == 200
            latencies.append(time.monotonic() - asked)
            time.sleep(0.01)
    thread.join(HANG_GUARD_S)
    return result["response"], latencies, result["duration"]  # type: ignore[return-value]


def test_health_answers_while_a_5mb_prompt_is_tokenized(server):
    response, latencies, duration = health_while(server, {"model": MODEL, "prompt": FIVE_MB_PROMPT, "max_tokens": 2})
    assert response.status_code == 400 and "max_model_len" in response.json()["error"]["message"]
    assert len(latencies) >= MIN_HEALTH_ANSWERS, (latencies, duration)
    assert max(latencies) < duration / 2, (max(latencies), duration)


def test_health_answers_while_a_huge_choice_list_is_compiled(server):
    body = {"model": MODEL, "prompt": "Pick one:", "max_tokens": 2, "temperature": 0.0,
            "structured_outputs": {"choice": MANY_CHOICES}}
    response, latencies, duration = health_while(server, body)
    assert response.status_code in (200, 400), response.text[:300]
    assert len(latencies) >= MIN_HEALTH_ANSWERS, (latencies, duration)
    assert max(latencies) < duration / 2, (max(latencies), duration)
    after = httpx.post(f"{server}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                       timeout=HANG_GUARD_S)
    assert after.status_code == 200
