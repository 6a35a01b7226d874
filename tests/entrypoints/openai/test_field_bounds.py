"""Every request field is held to its type's real range before the engine sees it (issue 40), in both modes.

One test per field class: integers (int64: 2**70 used to overflow the core's message encoder, a plain-text 500
in multiprocess mode), floats (finite: Python's JSON parser reads `NaN` and `Infinity`), lists (vLLM's length
limits, a non-empty `allowed_token_ids`), and vLLM's clamps (`logit_bias` to +-100, `max_tokens` to the room
the prompt leaves in the context). Every refusal is a 400 in OpenAI's shape naming the field; the values at
the edge of each range are never a 5xx; afterwards the engine still serves and holds no KV block.
scripts/test.sh runs this file again with the core in-process (MINI_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import asyncio

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
MAX_MODEL_LEN = 64
HUGE = 2**70
INT64_MAX = 2**63 - 1
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0.0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0.0}

INT_FIELDS = {   # field -> (route body, where it goes)
    "max_tokens": COMPLETION, "top_k": COMPLETION, "min_tokens": COMPLETION, "logprobs": COMPLETION,
    "n": COMPLETION, "seed": COMPLETION, "priority": COMPLETION,
    "max_completion_tokens": CHAT, "top_logprobs": CHAT,
}


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM.from_engine_args(max_num_seqs=8, max_model_len=MAX_MODEL_LEN)
    with serve_in_thread(build_app(engine, MODEL)) as url:
        yield url, engine
        stats = asyncio.run(engine.get_scheduler_stats())
        assert stats.kv_cache_usage == 0.0 and stats.num_running_reqs == 0   # nothing leaked


def post(url: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/{route}", json=body, timeout=HANG_GUARD_S)


def route_of(body: dict) -> str:
    return "completions" if "prompt" in body else "chat/completions"


def assert_refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, (field, response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["code"] == 400 and field in error["message"], (field, error)


@pytest.mark.parametrize("field", sorted(INT_FIELDS))
def test_integers_beyond_int64_are_400_naming_the_field(server, field):
    body = INT_FIELDS[field]
    for value in (HUGE, -HUGE):
        assert_refused(post(server[0], route_of(body), {**body, field: value}), field)
    nested = {**COMPLETION, "stop_token_ids": [HUGE]}
    assert_refused(post(server[0], "completions", nested), "stop_token_ids")
    assert_refused(post(server[0], "completions", {**COMPLETION, "prompt": [1, HUGE]}), "prompt")


@pytest.mark.parametrize("field", sorted(INT_FIELDS))
def test_integers_at_the_int64_edge_are_never_a_server_error(server, field):
    body = INT_FIELDS[field]
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    for value in (INT64_MAX, -(2**63)):
        response = post(server[0], route_of(body), {**body, **extra, field: value})
        assert response.status_code in (200, 400), (field, value, response.status_code, response.text[:300])
        if response.status_code == 400:
            assert response.json()["error"]["code"] == 400


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty"])
def test_non_finite_floats_are_400_naming_the_field(server, field, literal):
    text = f'{{"model": "{MODEL}", "prompt": "Hi", "max_tokens": 2, "{field}": {literal}}}'
    response = httpx.post(f"{server[0]}/v1/completions", content=text.encode(), timeout=HANG_GUARD_S,
                          headers={"content-type": "application/json"})
    assert_refused(response, field)
    bias = f'{{"model": "{MODEL}", "prompt": "Hi", "max_tokens": 2, "logit_bias": {{"5": {literal}}}}}'
    response = httpx.post(f"{server[0]}/v1/completions", content=bias.encode(), timeout=HANG_GUARD_S,
                          headers={"content-type": "application/json"})
    assert_refused(response, "logit_bias")


def test_list_limits_and_an_empty_allowed_token_ids(server):
    url = server[0]
    assert_refused(post(url, "completions", {**COMPLETION, "allowed_token_ids": []}), "allowed_token_ids")
    assert_refused(post(url, "completions", {**COMPLETION, "prompt": ["a"] * 1025}), "prompt")   # vLLM: 1024
    assert_refused(post(url, "completions", {**COMPLETION, "stop": ["a", "b", "c", "d", "e"]}), "stop")
    assert_refused(post(url, "completions", {**COMPLETION, "n": 16385}), "n")
    ignored = post(url, "completions", {**COMPLETION, "best_of": HUGE})   # no vLLM v0.33.0 field: ignored
    assert ignored.status_code == 200, ignored.text
    assert_refused(post(url, "completions", {**COMPLETION, "logit_bias": {"1" * 20: 1.0}}), "logit_bias")
    allowed = post(url, "completions", {**COMPLETION, "allowed_token_ids": [7], "max_tokens": 3})
    assert allowed.status_code == 200, allowed.text


def test_logit_bias_is_clamped_to_100_as_vllm(server):
    url = server[0]
    huge = post(url, "completions", {**COMPLETION, "max_tokens": 4, "logit_bias": {"7": 1e308, "8": -1e308}})
    clamped = post(url, "completions", {**COMPLETION, "max_tokens": 4, "logit_bias": {"7": 100.0, "8": -100.0}})
    assert huge.status_code == clamped.status_code == 200, huge.text
    assert huge.json()["choices"][0]["text"] == clamped.json()["choices"][0]["text"]


def test_max_tokens_beyond_the_context_is_clamped_to_the_room_left(server):
    url = server[0]
    prompt = [5, 6, 7, 8]
    reply = post(url, "completions", {**COMPLETION, "prompt": prompt, "max_tokens": 2**62, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == MAX_MODEL_LEN - len(prompt)
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    full = post(url, "completions", {**COMPLETION, "prompt": list(range(1, MAX_MODEL_LEN + 1))})
    assert_refused(full, "max_model_len")
    chat = post(url, "chat/completions", {**CHAT, "max_completion_tokens": HUGE - 1})
    assert_refused(chat, "max_completion_tokens")
    chat = post(url, "chat/completions", {**CHAT, "max_completion_tokens": 2**62})
    assert chat.status_code == 200, chat.text


def test_the_openapi_document_states_the_bounds(server):
    schemas = httpx.get(f"{server[0]}/openapi.json", timeout=HANG_GUARD_S).json()["components"]["schemas"]
    completion = schemas["CompletionRequest"]["properties"]

    def bounds(prop: dict) -> tuple:
        choice = next((c for c in prop.get("anyOf", [prop]) if c.get("type") == "integer"), prop)
        return choice.get("minimum"), choice.get("maximum")

    assert bounds(completion["max_tokens"]) == (1, INT64_MAX)
    assert bounds(completion["n"]) == (1, 16384)
    assert "best_of" not in completion
    assert bounds(completion["top_k"]) == (-1, INT64_MAX)
    allowed = next(c for c in completion["allowed_token_ids"]["anyOf"] if c.get("type") == "array")
    assert allowed["minItems"] == 1
    assert "clamped" in str(completion["logit_bias"])
    assert "trust-request-chat-template" in str(schemas["ChatCompletionRequest"]["properties"]["chat_template"])


def test_the_server_still_serves_after_the_hostile_requests(server):
    reply = post(server[0], "completions", COMPLETION)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
