"""The server's OpenAPI document (`GET /openapi.json`), declaring what each route really answers.

vLLM serves FastAPI's generated document as it is (vllm/entrypoints/launchers/app.py `build_app`), so it
declares FastAPI's default `422 HTTPValidationError` for bad bodies, although vLLM answers 400 in OpenAI's
shape, and `application/json` for `/health` and `/metrics`. mini's document is exact, so that a contract
checker (tests/entrypoints/openai/test_contract.py, schemathesis in tests/entrypoints/openai/test_schemathesis.py) holds
the server to it:

    every route         the 200 body: JSON with its schema; `/metrics` Prometheus text
                        (`text/plain; version=0.0.4; charset=utf-8`); `/health` no body
    /health             503 (no body) once the engine loop has died
    POST /v1/...        200 JSON, or `text/event-stream` when `stream` is true (each event's `data` is
                        a chunk's JSON, an ErrorResponse's JSON for an error mid-stream, or the final
                        `[DONE]`: Open API 3.1 has an event stream's `schema` describe one event, and
                        `contentSchema` the JSON inside `data`); 400 ErrorResponse for a
                        body that does not parse or a bad parameter (never 422); 404 ErrorResponse for a
                        model this server does not serve; 413 ErrorResponse for a body over
                        --max-request-body-size; 503 ErrorResponse once the engine has died
    /v1/... with keys   401 ErrorResponse, and the bearer security scheme (mini/entrypoints/openai/auth.py)

The route decorators in api_server.py take their `responses=` from here; `install_openapi` then removes
FastAPI's 422 and adds the security scheme.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from mini.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionStreamResponse,
    CompletionRequest,
    CompletionStreamResponse,
    ErrorResponse,
)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SSE_CONTENT_TYPE = "text/event-stream"
SECURITY_SCHEME = "bearerAuth"
REF = "#/components/schemas/{model}"
# The chunk model each streaming route sends (its schema goes into the components).
REQUEST_MODELS = (CompletionRequest, ChatCompletionRequest)
STREAM_MODELS = {"/v1/completions": CompletionStreamResponse, "/v1/chat/completions": ChatCompletionStreamResponse}


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


BAD_REQUEST = {400: _error("The body does not parse, or a parameter is out of range (OpenAI's error shape)")}
TOO_LARGE = {413: _error("The body is larger than --max-request-body-size")}
NOT_FOUND = {404: _error("The model is not served here")}
ENGINE_DEAD = {503: _error("The engine has died")}

HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The engine loop runs (no body)"},
    503: {"description": "The engine loop has died (no body)"},
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Prometheus text exposition format",
          "content": {PROMETHEUS_CONTENT_TYPE: {"schema": {"type": "string"}}}},
}


def generation_responses(response_model: type, stream_model: type) -> dict[int | str, dict[str, Any]]:
    """A completion route: a JSON response, or with `stream: true` SSE events of `stream_model` chunks."""
    return {
        200: {"model": response_model,
              "description": f"The whole response, or with `stream: true` server-sent events: `data: "
                             f"<{stream_model.__name__} JSON>` lines, then `data: [DONE]`",
              "content": {SSE_CONTENT_TYPE: {"schema": {"type": "object"}}}},   # see sse_event_schema
        **BAD_REQUEST, **NOT_FOUND, **TOO_LARGE, **ENGINE_DEAD,
    }


def sse_event_schema(chunk_model: type) -> dict[str, Any]:
    """One server-sent event of a stream: `data` is a chunk's JSON, an error's JSON, or `[DONE]`."""
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
        {"$ref": REF.format(model=chunk_model.__name__)}, {"$ref": REF.format(model=ErrorResponse.__name__)}]}}
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}}}


def _no_body(operation: dict[str, Any]) -> None:
    for response in operation["responses"].values():
        response.pop("content", None)


def build_openapi(app: FastAPI, secured: bool) -> dict[str, Any]:
    """FastAPI's generated document, made exact (see the module docstring)."""
    document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _, definitions = models_json_schema([(model, "serialization") for model in STREAM_MODELS.values()],
                                        ref_template=REF)
    for name, schema in definitions.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    # FastAPI passes the request schemas through its OpenAPI models, which hold bounds as floats: int64's
    # maximum 2**63 - 1 would read 9.223372036854776e+18 (2**63). Pydantic's own schemas keep them exact.
    _, request_definitions = models_json_schema([(model, "validation") for model in REQUEST_MODELS],
                                                ref_template=REF)
    for name, schema in request_definitions.get("$defs", {}).items():
        if name in schemas:
            schemas[name] = schema
    for path, methods in document["paths"].items():
        for operation in methods.values():
            operation["responses"].pop("422", None)
            if path == "/health":
                _no_body(operation)
            if path in STREAM_MODELS:
                operation["responses"]["200"]["content"][SSE_CONTENT_TYPE]["schema"] = \
                    sse_event_schema(STREAM_MODELS[path])
            if secured and (path == "/v1" or path.startswith("/v1/")):
                operation["security"] = [{SECURITY_SCHEME: []}]
                operation["responses"]["401"] = {
                    "description": "Missing or wrong API key (send 'Authorization: Bearer <key>')",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
    if secured:
        # ErrorResponse is in the components already: the POST routes declare their 400 with it.
        components = document.setdefault("components", {})
        components["securitySchemes"] = {SECURITY_SCHEME: {"type": "http", "scheme": "bearer"}}
    return document


def install_openapi(app: FastAPI, secured: bool) -> None:
    """Serve `build_openapi`'s document at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, secured)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
