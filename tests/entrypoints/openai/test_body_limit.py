"""The request body limit (`--max-request-body-size`, vLLM's VLLM_HTTP_MAX_REQUEST_BODY_SIZE, 32 MiB by default).

A body declared larger than the limit is refused before it is read; a chunked body (no Content-Length) is
counted as it arrives and refused once it passes the limit. Both get 413 in OpenAI's error shape, and the
server serves the next request.
"""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, serve_in_thread
from mini.entrypoints.openai.serve_options import DEFAULT_MAX_REQUEST_BODY_SIZE, ServeOptions

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
LIMIT = 2048


@pytest.fixture(scope="module")
def url():
    engine = AsyncLLM.from_engine_args(max_num_seqs=2, max_model_len=64)
    with serve_in_thread(build_app(engine, MODEL, options=ServeOptions(max_request_body_size=LIMIT))) as base:
        yield base


def body_of(prompt_chars: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "x" * prompt_chars, "max_tokens": 1}).encode()


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == 413 and str(LIMIT) in error["message"] and "--max-request-body-size" in error["message"]


def test_the_default_is_vllms_32_mib():
    assert ServeOptions().max_request_body_size == DEFAULT_MAX_REQUEST_BODY_SIZE == 32 * 1024 * 1024


def test_a_declared_large_body_is_refused(url):
    response = httpx.post(f"{url}/v1/completions", content=body_of(4 * LIMIT), timeout=HANG_GUARD_S,
                          headers={"content-type": "application/json"})
    assert_too_large(response)


def test_a_chunked_large_body_is_refused_as_it_arrives(url):
    payload = body_of(4 * LIMIT)

    def chunks():
        for start in range(0, len(payload), 512):
            yield payload[start:start + 512]

    response = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=HANG_GUARD_S,
                          headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_too_large(response)


def test_a_body_under_the_limit_is_served(url):
    response = httpx.post(f"{url}/v1/completions", content=body_of(100), timeout=HANG_GUARD_S,
                          headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text[:300]
