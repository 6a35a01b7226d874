"""`--api-key` / `MINI_API_KEY`: every /v1 route answers 401 in OpenAI's shape without the right bearer key."""

from __future__ import annotations

import argparse
import hashlib

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai import auth
from mini.entrypoints.openai.api_server import add_serve_arguments, build_app, serve_in_thread
from mini.entrypoints.openai.auth import API_KEY_ENV, AuthenticationMiddleware, api_keys_from

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
KEYS = ["first-key", "second-key"]
COMPLETION = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0.0}


@pytest.fixture(scope="module")
def url():
    engine = AsyncLLM.from_engine_args(max_num_seqs=4, max_model_len=64)
    with serve_in_thread(build_app(engine, MODEL, api_keys=KEYS)) as base:
        yield base
    assert not engine.is_running


def assert_unauthorized(response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 401 and error["type"] == "AuthenticationError" and "Bearer" in error["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer"},
                                     {"Authorization": "Basic Zmlyc3Qta2V5Og=="}, {"Authorization": "first-key"},
                                     {"Authorization": "Bearer first-key-and-more"}, {"X-Api-Key": "first-key"}])
def test_v1_routes_refuse_a_missing_or_wrong_key(url, headers):
    assert_unauthorized(httpx.get(f"{url}/v1/models", headers=headers, timeout=HANG_GUARD_S))
    assert_unauthorized(httpx.post(f"{url}/v1/completions", json=COMPLETION, headers=headers, timeout=HANG_GUARD_S))
    assert_unauthorized(httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=HANG_GUARD_S,
                                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}))
    # the key is checked before the body: a bad body without a key is a 401, not a 400
    assert_unauthorized(httpx.post(f"{url}/v1/completions", content=b"{oops", headers=headers, timeout=HANG_GUARD_S))
    # every path under /v1 is guarded, even one that does not exist
    assert_unauthorized(httpx.get(f"{url}/v1/no-such-route", headers=headers, timeout=HANG_GUARD_S))


@pytest.mark.parametrize("key", KEYS)
def test_each_key_is_accepted_and_the_scheme_is_case_insensitive(url, key):
    for scheme in ("Bearer", "bearer"):
        headers = {"Authorization": f"{scheme} {key}"}
        assert httpx.get(f"{url}/v1/models", headers=headers, timeout=HANG_GUARD_S).json()["data"][0]["id"] == MODEL
        reply = httpx.post(f"{url}/v1/completions", json=COMPLETION, headers=headers, timeout=HANG_GUARD_S)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    # with the key, errors are the usual ones
    bad = httpx.post(f"{url}/v1/completions", json={**COMPLETION, "n": 0}, timeout=HANG_GUARD_S,
                     headers={"Authorization": f"Bearer {key}"})
    assert bad.status_code == 400


def test_health_metrics_and_the_document_stay_open(url):
    assert httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 200
    assert "# TYPE" in httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text
    document = httpx.get(f"{url}/openapi.json", timeout=HANG_GUARD_S).json()
    assert document["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}


def test_the_openai_client(url):
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[1], max_retries=0, timeout=HANG_GUARD_S)
    assert good.completions.create(**COMPLETION).choices[0].finish_reason == "length"
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0, timeout=HANG_GUARD_S)
    with pytest.raises(openai.AuthenticationError) as error:
        wrong.models.list()
    assert error.value.status_code == 401


def test_keys_come_from_the_flag_else_the_environment():
    assert api_keys_from(["a", "b"], {API_KEY_ENV: "env"}) == ["a", "b"]   # the flag wins, as vLLM's
    assert api_keys_from(None, {API_KEY_ENV: "env"}) == ["env"]
    assert api_keys_from(None, {API_KEY_ENV: ""}) == [] == api_keys_from(None, {})
    parser = add_serve_arguments(argparse.ArgumentParser())
    assert parser.parse_args(["--api-key", "a", "b"]).api_key == ["a", "b"]
    assert parser.parse_args(["--api-key", "a", "--api-key", "b"]).api_key == ["a", "b"]
    assert parser.parse_args([]).api_key is None
    with pytest.raises(ValueError, match="api_keys"):
        AuthenticationMiddleware(lambda *a: None, [])
    with pytest.raises(ValueError, match="api_keys"):
        AuthenticationMiddleware(lambda *a: None, ["ok", ""])


def test_the_key_is_compared_in_constant_time(monkeypatch):
    """Digests of equal length, compared with compare_digest against every key (no early exit)."""
    middleware = AuthenticationMiddleware(lambda *a: None, ["k1", "k2", "k3"])
    calls = []

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return a == b

    monkeypatch.setattr(auth.secrets, "compare_digest", compare)
    from starlette.datastructures import Headers

    for token, expected in (("k1", True), ("k3", True), ("x" * 1000, False)):
        calls.clear()
        assert middleware.authorized(Headers({"authorization": f"Bearer {token}"})) is expected
        assert calls == [(32, 32)] * 3
    assert middleware.key_digests[0] == hashlib.sha256(b"k1").digest()
