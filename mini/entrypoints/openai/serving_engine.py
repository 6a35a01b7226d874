"""What the completion and chat handlers share: model check, errors, starting streams, SSE framing.

Mirrors vllm/entrypoints/serve/engine/serving.py (`BaseServing._check_model`, `BaseServing.create_error_response`),
vllm/entrypoints/generate/base/serving.py (`GenerateBaseServing.create_streaming_error_response`) and
vllm/utils/async_utils.py (`merge_async_iterators`); vLLM's older `OpenAIServing` held them in one class.

Prompts reach the engine tokenized: the handlers tokenize (and render chat templates) on the renderer's worker
thread (mini/entrypoints/openai/renderer.py), then clamp `max_tokens` to the room the prompt leaves in the
context, as vLLM's `get_max_tokens` (vllm/entrypoints/serve/utils/api_utils.py); a prompt longer than the
context is a 400 before anything reaches the engine.

Streams are started with `start_streams`: it awaits each request's FIRST output before the handler
answers, so a request the engine refuses (prompt too long, token id out of vocabulary, a duplicate id)
becomes a 400 response, not a broken 200 stream. Everything started is aborted if anything fails.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingRequest, UsageInfo
from mini.entrypoints.openai.renderer import PromptRenderer
from mini.entrypoints.openai.serve_options import ServeOptions
from mini.outputs import RequestOutput
from mini.sampling_params import SamplingParams


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, status_code: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.err_type = err_type
        self.param = param

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=str(self), type=self.err_type, param=self.param,
                                             code=self.status_code))


def sse(payload: Any) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    text = payload.model_dump_json(exclude_unset=False) if hasattr(payload, "model_dump_json") else json.dumps(payload)
    return f"data: {text}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def merge_async_iterators(*iterators: AsyncIterator[Any]) -> AsyncGenerator[tuple[int, Any], None]:
    """Interleave several async iterators as their items arrive: yields (iterator index, item)."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    done = object()
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue(maxsize=len(iterators))

    async def drain(index: int, iterator: AsyncIterator[Any]) -> None:
        try:
            async for item in iterator:
                await queue.put((index, item, None))
            await queue.put((index, done, None))
        except Exception as error:  # noqa: BLE001  (re-raised by the consumer)
            await queue.put((index, done, error))

    tasks = [asyncio.create_task(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                remaining -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class OpenAIServing:
    """The engine, the names it is served under, and the helpers every handler uses."""

    def __init__(self, engine: AsyncLLM, served_model_names: list[str], renderer: PromptRenderer | None = None,
                 lora_modules: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        # --lora-modules: adapter name -> LoRARequest; a request naming one as its `model` runs with it
        # (vLLM: vllm/entrypoints/openai/models/serving.py `OpenAIServingModels`).
        self.lora_modules = dict(lora_modules or {})
        self.max_model_len = int(engine.config.max_model_len)
        self.renderer = renderer if renderer is not None else PromptRenderer(engine.tokenizer, ServeOptions())

    def check_model(self, model: str | None) -> None:
        """404 for a model this server does not serve (None: the default one, as vLLM allows)."""
        if model is not None and model not in self.served_model_names and model not in self.lora_modules:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")

    @staticmethod
    def sampling_params(request: SamplingRequest, context_room: int | None = None) -> SamplingParams:
        try:
            return request.to_sampling_params(context_room)
        except (ValueError, TypeError) as error:
            raise OpenAIError(str(error)) from error

    def context_room(self, num_prompt_tokens: int, param: str) -> int:
        """The tokens a prompt of this length leaves to generate; 400 when it leaves none."""
        if num_prompt_tokens >= self.max_model_len:
            raise OpenAIError(f"the prompt is {num_prompt_tokens} tokens long, which leaves no room to generate "
                              f"in the model's context of max_model_len={self.max_model_len} tokens", param=param)
        return self.max_model_len - num_prompt_tokens

    def params_for_prompt(self, request: SamplingRequest, num_prompt_tokens: int, param: str) -> SamplingParams:
        """The request's SamplingParams with `max_tokens` clamped to what this prompt leaves of the context."""
        return self.sampling_params(request, self.context_room(num_prompt_tokens, param))

    def tokenizer(self) -> Any:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise OpenAIError("this server was started without a tokenizer: text prompts and chat are unavailable")
        return tokenizer

    def lora_request(self, model: str | None) -> Any:
        """The LoRARequest of the adapter named as the request's `model`, or None (the base model)."""
        return self.lora_modules.get(model) if model is not None else None

    async def start_streams(self, prompts: list[Any], params: list[SamplingParams], request_id: str,
                            priority: int, lora_request: Any = None
                            ) -> list[tuple[RequestOutput, AsyncGenerator[RequestOutput, None]]]:
        """Start one engine request per prompt (with its own params); -> (first output, rest of the stream)."""
        streams = [self.engine.generate(prompt, prompt_params, f"{request_id}-{i}", priority=priority,
                                        lora_request=lora_request)
                   for i, (prompt, prompt_params) in enumerate(zip(prompts, params, strict=True))]
        tasks = [asyncio.ensure_future(anext(stream)) for stream in streams]
        try:
            firsts = await asyncio.gather(*tasks)
        except BaseException as error:  # cancel the others (their generators abort), then close all
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(stream.aclose() for stream in streams), return_exceptions=True)
            if isinstance(error, (ValueError, TypeError)):
                raise OpenAIError(str(error)) from error
            raise
        return list(zip(firsts, streams, strict=False))

    @staticmethod
    async def with_first(first: RequestOutput, rest: AsyncGenerator[RequestOutput, None]
                         ) -> AsyncGenerator[RequestOutput, None]:
        """The first output again, then the rest of the stream (closing the stream when done or dropped)."""
        try:
            yield first
            if not first.finished:
                async for output in rest:
                    yield output
        finally:
            await rest.aclose()

    @staticmethod
    def usage(num_prompt_tokens: int, num_completion_tokens: int) -> UsageInfo:
        return UsageInfo(prompt_tokens=num_prompt_tokens, completion_tokens=num_completion_tokens,
                         total_tokens=num_prompt_tokens + num_completion_tokens)
