"""The OpenAI-compatible HTTP server: `python -m mini serve [MODEL] --host 127.0.0.1 --port 8000`.

Mirrors vllm/entrypoints/launchers/app.py (`build_app`), vllm/entrypoints/launchers/api_server/entry.py
(`run_server`) and vllm/entrypoints/cli/serve.py; vllm/entrypoints/openai/api_server.py, where these lived,
now only re-exports them (deprecated). The routes: vllm/entrypoints/openai/completion/api_router.py and its
siblings; client disconnects: `with_cancellation` in vllm/entrypoints/serve/utils/api_utils.py.
FastAPI routes on one `AsyncLLM` (mini/engine/async_llm.py), served by uvicorn:

    GET  /health               200 while the engine loop runs, 503 once it has died
    GET  /v1/models            the served model (its name: --served-model-name, else MODEL, else "tiny-llama")
    POST /v1/completions       mini/entrypoints/openai/serving_completion.py
    POST /v1/chat/completions  mini/entrypoints/openai/serving_chat.py
    GET  /metrics              Prometheus text (mini/entrypoints/openai/metrics.py)
    GET  /openapi.json         the routes' contract (mini/entrypoints/openai/openapi.py)

Every error is answered in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a
body that does not parse or a bad parameter, 404 for a model this server does not serve, 503 once the
engine has died, and, when the server has API keys (`--api-key` or `MINI_API_KEY`,
mini/entrypoints/openai/auth.py), 401 on every `/v1` route without `Authorization: Bearer <key>`. The
OpenAPI document at /openapi.json declares exactly these (mini/entrypoints/openai/openapi.py). A client that
disconnects cancels its handler, which aborts its engine requests (their KV blocks are freed before the
next step): for streams Starlette does it, for whole responses `with_cancellation` below.

`main` adds the command line's hardening (mini/entrypoints/openai/serve_options.py): a stop signal at any moment
of start-up shuts everything down cleanly, the server exits with status 1 when its engine core dies, and the
shutdown drain lasts at most `--shutdown-timeout` (mini/entrypoints/openai/server_lifecycle.py).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import socket
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mini.config import add_engine_arguments, cli_engine_args
from mini.engine.async_llm import AsyncLLM, EngineDeadError
from mini.engine.dp_client import dp_stat_logger_args, engine_cores_alive
from mini.entrypoints.openai.auth import API_KEY_ENV, AuthenticationMiddleware, api_keys_from
from mini.entrypoints.openai.body_limit import RequestBodyLimitMiddleware
from mini.entrypoints.openai.metrics import PrometheusStatLogger, refresh_gauges
from mini.entrypoints.openai.openapi import (
    HEALTH_RESPONSES,
    METRICS_RESPONSES,
    PROMETHEUS_CONTENT_TYPE,
    generation_responses,
    install_openapi,
)
from mini.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    ModelCard,
    ModelList,
)
from mini.entrypoints.openai.renderer import PromptRenderer
from mini.entrypoints.openai.serve_options import ServeOptions, add_serve_options, serve_options_from
from mini.entrypoints.openai.server_lifecycle import StopSignals, watch_engine
from mini.entrypoints.openai.serving_chat import OpenAIServingChat
from mini.entrypoints.openai.serving_completion import OpenAIServingCompletion
from mini.entrypoints.openai.serving_engine import OpenAIError

logger = logging.getLogger("mini.serve")

SHIPPED_MODEL_NAME = "tiny-llama"


def error_json(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.to_response().model_dump(), status_code=error.status_code)


def with_cancellation(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Cancel a non-streaming handler when its client disconnects (vLLM: entrypoints/utils.with_cancellation)."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        raw_request: Request = kwargs["raw_request"]
        handler_task = asyncio.ensure_future(handler(*args, **kwargs))

        async def wait_for_disconnect() -> None:
            while True:
                message = await raw_request.receive()
                if message["type"] == "http.disconnect":
                    return

        disconnect_task = asyncio.ensure_future(wait_for_disconnect())
        done, _ = await asyncio.wait([handler_task, disconnect_task], return_when=asyncio.FIRST_COMPLETED)
        if handler_task not in done:
            handler_task.cancel()
        disconnect_task.cancel()
        await asyncio.gather(disconnect_task, return_exceptions=True)
        if handler_task not in done:
            await asyncio.gather(handler_task, return_exceptions=True)
            return None
        return handler_task.result()

    return wrapper


# Complex by design: a route per endpoint.
def build_app(engine: AsyncLLM, served_model_name: str, stat_logger: PrometheusStatLogger | None = None,  # noqa: C901
              shutdown_engine: bool = True, api_keys: Sequence[str] | None = None,
              options: ServeOptions | None = None, lora_modules: dict[str, Any] | None = None) -> FastAPI:
    """The FastAPI app on `engine`. `shutdown_engine`: stop the engine loop when the app shuts down.

    `api_keys`: when given (non-empty), every `/v1` route requires `Authorization: Bearer <one of them>`
    (the command line passes `--api-key`, else `MINI_API_KEY`; build_app itself reads no environment).
    `options`: request-template trust, template bounds, body size limit (mini/entrypoints/openai/serve_options.py;
    default: vLLM's defaults). `lora_modules` (`parse_lora_modules`): adapters served under their own names."""
    options = options or ServeOptions()
    lora_modules = dict(lora_modules or {})
    for lora in lora_modules.values():   # refused at start-up, as vLLM loads them then (the adapter named)
        engine.engine.input_processor._validate_lora(lora)
    # one series per engine core with --data-parallel-size N (label engine="0", "1", ...), as vLLM's
    stat_logger = stat_logger or PrometheusStatLogger(served_model_name, **dp_stat_logger_args(engine))
    if stat_logger not in engine.stat_loggers:
        engine.stat_loggers.append(stat_logger)
    names = [served_model_name]
    renderer = PromptRenderer(engine.tokenizer, options)
    completions = OpenAIServingCompletion(engine, names, renderer, lora_modules)
    chat = OpenAIServingChat(engine, names, renderer, lora_modules)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
        yield
        renderer.shutdown()
        if shutdown_engine:
            engine.shutdown()

    app = FastAPI(title="mini OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine
    app.state.stat_logger = stat_logger
    app.state.options = options
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=options.max_request_body_size)
    if api_keys:
        app.add_middleware(AuthenticationMiddleware, api_keys=list(api_keys))
    install_openapi(app, secured=bool(api_keys))

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, error: OpenAIError) -> JSONResponse:
        return error_json(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        """Starlette's own errors (a body that is not UTF-8 JSON, 404 path, 405 method) in OpenAI's shape too."""
        try:
            name = HTTPStatus(error.status_code).phrase.replace(" ", "").replace("-", "") + "Error"
        except ValueError:
            name = "HTTPError"
        response = error_json(OpenAIError(str(error.detail), error.status_code, name))
        response.headers.update(error.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        param = ".".join(str(p) for p in problems[0].get("loc", ())[1:]) if problems else None
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                            for e in problems)
        return error_json(OpenAIError(message or "invalid request body", param=param or None))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, error: EngineDeadError) -> JSONResponse:
        return error_json(OpenAIError(str(error), 503, "ServiceUnavailableError"))

    @app.get("/health", response_class=Response, responses=HEALTH_RESPONSES)
    async def health() -> Response:
        healthy = engine.is_running and not engine.errored and engine_cores_alive(engine)   # every core
        return Response(status_code=200 if healthy else 503)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=served_model_name, root=served_model_name,
                                         max_model_len=completions.max_model_len)]
                         + [ModelCard(id=name, root=lora.lora_path, parent=served_model_name,
                                      max_model_len=completions.max_model_len) for name, lora in lora_modules.items()])

    @app.get("/metrics", response_class=Response, responses=METRICS_RESPONSES)
    async def metrics() -> Response:
        await refresh_gauges(engine, stat_logger)
        return Response(stat_logger.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def respond(result: Any) -> Response:
        if result is None:  # the client went away
            return Response(status_code=499)
        if isinstance(result, AsyncGenerator):
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(result.model_dump())

    @app.post("/v1/completions", response_class=JSONResponse,
              responses=generation_responses(CompletionResponse, CompletionStreamResponse))
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
        return await respond(await with_cancellation(_completion)(request, raw_request=raw_request))

    async def _completion(request: CompletionRequest, raw_request: Request) -> Any:
        return await completions.create_completion(request)

    @app.post("/v1/chat/completions", response_class=JSONResponse,
              responses=generation_responses(ChatCompletionResponse, ChatCompletionStreamResponse))
    async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
        return await respond(await with_cancellation(_chat)(request, raw_request=raw_request))

    async def _chat(request: ChatCompletionRequest, raw_request: Request) -> Any:
        return await chat.create_chat_completion(request)

    return app


# ---------------------------------------------------------------------------- in-process server
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int | None = None,
                    start_timeout_s: float = 30.0) -> Iterator[str]:
    """Run uvicorn on a thread (tests, benchmarks, notebooks); yields the base URL, stops it on exit."""
    import uvicorn

    port = free_port(host) if port is None else port
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="mini-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port} within {start_timeout_s} s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(start_timeout_s)


# ---------------------------------------------------------------------------- the command line
# The engine arguments `serve` takes (vLLM's `serve` takes every EngineArgs field; mini, these), each
# generated from its EngineConfig field (mini/config.py): flag, default, help, choices.
SERVE_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
                     "num_gpu_blocks_override", "kv_cache_memory_bytes", "gpu_memory_utilization",
                     "enable_prefix_caching", "scheduling_policy", "enforce_eager", "device", "dtype", "seed",
                     "speculative_config", "tensor_parallel_size", "data_parallel_size", "async_scheduling",
                     "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")


def parse_lora_modules(values: Sequence[str] | None) -> dict[str, Any]:
    """`--lora-modules name=path ...` -> {name: LoRARequest(name, i, path)}, ids 1, 2, ... in order (vLLM's
    `LoRAModulePath` list, vllm/entrypoints/common/cli_args.py; mini takes the `name=path` form only)."""
    from mini.lora.request import LoRARequest

    modules: dict[str, Any] = {}
    for value in values or ():
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes name=path pairs, got {value!r}")
        if name in modules:
            raise ValueError(f"--lora-modules names {name!r} twice")
        modules[name] = LoRARequest(name, len(modules) + 1, path)
    return modules


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model", nargs="?", default=None,
                        help="local HF folder, .gguf file or offline hub id (default: the shipped tiny model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--api-key", nargs="+", action="extend", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every /v1 route (several keys allowed; "
                             f"default: the environment variable {API_KEY_ENV}, else no key)")
    add_serve_options(parser)
    add_engine_arguments(parser, SERVE_ENGINE_ARGS)
    parser.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                        help="LoRA adapters served as models of their own (needs --enable-lora): a request whose "
                             "`model` is NAME runs with the PEFT adapter folder PATH")
    parser.add_argument("--log-level", default="info")
    return parser


def engine_args_from(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": args.model, **cli_engine_args(args, SERVE_ENGINE_ARGS)}


def served_name(args: argparse.Namespace) -> str:
    return args.served_model_name or args.model or SHIPPED_MODEL_NAME


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT (exit status 128 + the signal) or the engine's death (exit status 1, unless
    --keep-alive-on-engine-death)."""
    stop = StopSignals()
    stop.install()   # first: a signal during start-up leaves nothing behind
    import uvicorn

    parser = add_serve_arguments(argparse.ArgumentParser(
        prog="python -m mini serve", description="an OpenAI-compatible server on one mini engine"))
    args = parser.parse_args(argv)
    try:
        options = serve_options_from(args)
        lora_modules = parse_lora_modules(args.lora_modules)
        if lora_modules and not args.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine: AsyncLLM | None = None
    try:
        try:
            engine = AsyncLLM.from_engine_args(**engine_args_from(args))
        except BaseException:
            if stop.received is not None:   # the signal reached the core too: it stopped its start-up
                return 128 + stop.received
            raise
        if stop.received is not None:
            logger.info("stopping: signal %d during start-up", stop.received)
            return 128 + stop.received
        api_keys = api_keys_from(args.api_key)
        app = build_app(engine, served_name(args), api_keys=api_keys, options=options, lora_modules=lora_modules)
        if api_keys:
            logger.info("/v1 routes require one of %d API key(s)", len(api_keys))
        logger.info("serving %s on http://%s:%d", served_name(args), args.host, args.port)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                               timeout_graceful_shutdown=options.shutdown_timeout_s))
        died = threading.Event()
        threading.Thread(target=watch_engine, args=(server, engine, died, stop, options.keep_alive_on_engine_death),
                         name="mini-engine-watchdog", daemon=True).start()
        server.run()
        if died.is_set():
            return 1
        return 0 if stop.received is None else 128 + stop.received
    finally:
        if engine is not None:
            engine.shutdown()
