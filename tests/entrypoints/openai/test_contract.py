"""The server's OpenAPI document against what the server really answers (shipped tiny model, 127.0.0.1).

Every response the document declares (path, method, status, media type) is driven by a live call here, and
every live answer must be declared: its status, its Content-Type, and its body valid against the declared
schema (server-sent events: each event's `data` JSON against the chunk or error schema).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.chat_utils import ROLES
from mini.entrypoints.openai.api_server import build_app, serve_in_thread
from mini.entrypoints.openai.openapi import PROMETHEUS_CONTENT_TYPE, SSE_CONTENT_TYPE
from mini.entrypoints.openai.protocol import ChatCompletionMessageParam
from mini.entrypoints.openai.serve_options import ServeOptions

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
KEY = "contract-key"
KEYED_BODY_LIMIT = 4096   # the keyed server's --max-request-body-size: a larger body is a 413
AUTH = {"Authorization": f"Bearer {KEY}"}
GEN = {"max_tokens": 3, "temperature": 0.0}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], **GEN}
COMPLETION = {"prompt": "Once upon a time", **GEN}

# (server, method, path, request kwargs, expected status, expected media type or None for no body)
# server: "open" (no key), "keyed" (API key), "dead" (engine shut down).
CASES: list[tuple[str, str, str, dict[str, Any], int, str | None]] = [
    ("open", "GET", "/health", {}, 200, None),
    ("dead", "GET", "/health", {}, 503, None),
    ("open", "GET", "/metrics", {}, 200, PROMETHEUS_CONTENT_TYPE),
    ("keyed", "GET", "/metrics", {}, 200, PROMETHEUS_CONTENT_TYPE),
    ("open", "GET", "/v1/models", {}, 200, "application/json"),
    ("keyed", "GET", "/v1/models", {"headers": AUTH}, 200, "application/json"),
    ("keyed", "GET", "/v1/models", {}, 401, "application/json"),
]
for route, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
    CASES += [
        ("open", "POST", route, {"json": {"model": MODEL, **body}}, 200, "application/json"),
        ("open", "POST", route, {"json": {**body, "stream": True, "stream_options": {"include_usage": True}}},
         200, SSE_CONTENT_TYPE),
        ("open", "POST", route, {"json": {**body, "n": "2"}}, 400, "application/json"),
        ("open", "POST", route, {"json": {**body, "temperature": -1}}, 400, "application/json"),
        ("open", "POST", route, {"content": b"{not json", "headers": {"content-type": "application/json"}},
         400, "application/json"),
        ("open", "POST", route, {"content": b"\xff\xfe\x00", "headers": {"content-type": "application/json"}},
         400, "application/json"),
        ("open", "POST", route, {"json": {"model": "no-such-model", **body}}, 404, "application/json"),
        ("keyed", "POST", route, {"json": body}, 401, "application/json"),
        ("keyed", "POST", route, {"json": body, "headers": AUTH}, 200, "application/json"),
        ("keyed", "POST", route, {"json": {**body, "user": "x" * KEYED_BODY_LIMIT}, "headers": AUTH}, 413,
         "application/json"),
        ("dead", "POST", route, {"json": body}, 503, "application/json"),
    ]


@pytest.fixture(scope="module")
def servers():
    """Three servers on one process: open, keyed (with a small body limit), and one whose engine is shut down."""
    engines = [AsyncLLM.from_engine_args(max_num_seqs=4, max_model_len=64) for _ in range(3)]
    apps = {"open": build_app(engines[0], MODEL),
            "keyed": build_app(engines[1], MODEL, api_keys=[KEY],
                               options=ServeOptions(max_request_body_size=KEYED_BODY_LIMIT)),
            "dead": build_app(engines[2], MODEL)}
    engines[2].shutdown()
    with serve_in_thread(apps["open"]) as open_url, serve_in_thread(apps["keyed"]) as keyed_url, \
            serve_in_thread(apps["dead"]) as dead_url:
        yield {"open": open_url, "keyed": keyed_url, "dead": dead_url}
    assert not any(engine.is_running for engine in engines)


@pytest.fixture(scope="module")
def documents(servers):
    return {name: httpx.get(f"{url}/openapi.json", timeout=HANG_GUARD_S).json() for name, url in servers.items()}


def declared(document: dict, method: str, path: str) -> dict[str, Any]:
    return document["paths"][path][method.lower()]["responses"]


def validator(document: dict, schema: dict) -> Any:
    """A validator of `schema` whose `#/components/...` references resolve in `document`."""
    return jsonschema.Draft202012Validator({"allOf": [schema], "components": document["components"]})


def check_sse(document: dict, media: dict, text: str) -> int:
    """Each event's data against the declared event schema, its JSON against the declared contentSchema."""
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.strip()]
    data_schema = media["schema"]["properties"]["data"]
    json_branch = next(branch for branch in data_schema["anyOf"] if "contentSchema" in branch)
    assert events[-1] == "[DONE]", events[-1:]
    for event in events:
        assert text.count(f"data: {event}") >= 1
        validator(document, media["schema"]).validate({"data": event})
        if event != "[DONE]":
            validator(document, json_branch["contentSchema"]).validate(json.loads(event))
    return len(events)


def test_document_declares_no_422_and_the_real_content_types(documents):
    for name, document in documents.items():
        assert "HTTPValidationError" not in document["components"]["schemas"]
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                assert "422" not in operation["responses"], (name, method, path)
                if method == "post":
                    assert {"200", "400", "404", "503"} <= set(operation["responses"]), (name, path)
        assert list(declared(document, "GET", "/metrics")["200"]["content"]) == [PROMETHEUS_CONTENT_TYPE]
        assert all("content" not in response for response in declared(document, "GET", "/health").values())
        assert set(declared(document, "GET", "/health")) == {"200", "503"}
    # the message roles the schema allows are the ones the chat renderer accepts
    roles = ChatCompletionMessageParam.model_json_schema()["properties"]["role"]["enum"]
    assert tuple(roles) == ROLES


def test_bearer_security_is_declared_on_v1_routes_only_when_keyed(documents):
    keyed, opened = documents["keyed"], documents["open"]
    assert keyed["components"]["securitySchemes"] == {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    assert "securitySchemes" not in opened["components"]
    for path, methods in keyed["paths"].items():
        for operation in methods.values():
            is_v1 = path.startswith("/v1/")
            assert (operation.get("security") == [{"bearerAuth": []}]) is is_v1, path
            assert ("401" in operation["responses"]) is is_v1, path
    for methods in opened["paths"].values():
        assert all("security" not in op and "401" not in op["responses"] for op in methods.values())


@pytest.mark.parametrize("server,method,path,kwargs,status,media", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_live_answer_is_declared(servers, documents, server, method, path, kwargs, status, media):
    document = documents[server]
    response = httpx.request(method, f"{servers[server]}{path}", timeout=HANG_GUARD_S, **kwargs)
    assert response.status_code == status, response.text
    responses = declared(document, method, path)
    assert str(status) in responses, f"{method} {path} answered an undeclared {status}"
    content = responses[str(status)].get("content")
    content_type = response.headers.get("content-type")
    if media is None:
        assert content is None and response.content == b""
        return
    assert content_type is not None and content_type.startswith(media), content_type
    assert media in content, f"{method} {path} {status}: {media} is not declared (declared: {list(content or {})})"
    if media == SSE_CONTENT_TYPE:
        assert check_sse(document, content[media], response.text) >= 3
    elif media == "application/json":
        validator(document, content[media]["schema"]).validate(response.json())
        if status >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            assert response.json()["error"]["code"] == status
    else:
        assert "# TYPE" in response.text


def test_every_declared_response_is_driven(documents):
    """The cases above cover the whole document: a newly declared response needs a live case here."""
    driven = {(server, method.lower(), path, str(status), media) for server, method, path, _, status, media in CASES}
    for server, document in documents.items():
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                if path in ("/openapi.json", "/docs", "/redoc"):
                    continue
                for status, response in operation["responses"].items():
                    medias = list(response.get("content") or {None: None})
                    for media in medias:
                        # a declaration holds for every server kind; one live case for it suffices
                        assert any((m, p, s, md) == (method, path, status, media)
                                   for _, m, p, s, md in driven), (server, method, path, status, media)
