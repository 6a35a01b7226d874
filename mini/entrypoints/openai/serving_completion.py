"""POST /v1/completions: prompts in, text out, whole or as server-sent events.

Mirrors vllm/entrypoints/openai/completion/serving.py (`OpenAIServingCompletion`). `prompt` may be a
string, a list of strings, a list of token ids or a list of such lists; each prompt is one engine
request `cmpl-<id>-<i>`, and its `n` samples are choices `i * n + sample index`, as in vLLM. Streamed,
every engine output becomes one `text_completion` chunk per sample that has new text; the last chunk
of a sample carries its `finish_reason`; `stream_options.include_usage` adds a final chunk with empty
`choices` and the usage; the stream ends with `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from mini.entrypoints.openai.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamResponse,
    random_id,
)
from mini.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIError,
    OpenAIServing,
    merge_async_iterators,
    sse,
)
from mini.outputs import CompletionOutput, RequestOutput, SampleLogprobs


def completion_logprobs(logprobs: SampleLogprobs, token_ids: list[int], tokenizer: Any,
                        text_offset_start: int = 0) -> CompletionLogProbs:
    """vLLM's per-token logprobs -> OpenAI's completion layout (tokens, token_logprobs, top_logprobs, offsets)."""
    result = CompletionLogProbs()
    offset = text_offset_start
    for token_id, candidates in zip(token_ids, logprobs, strict=False):
        def text_of(tid: int, entry: Any) -> str:
            if entry is not None and entry.decoded_token is not None:
                return entry.decoded_token
            return tokenizer.decode([tid]) if tokenizer is not None else f"token_id:{tid}"

        sampled = candidates.get(token_id)
        token_text = text_of(token_id, sampled)
        result.tokens.append(token_text)
        result.token_logprobs.append(None if sampled is None else max(sampled.logprob, -9999.0))
        result.top_logprobs.append({text_of(tid, lp): max(lp.logprob, -9999.0) for tid, lp in candidates.items()})
        result.text_offset.append(offset)
        offset += len(token_text)
    return result


def completion_stream_choices(output: RequestOutput, prompt_index: int = 0, n: int = 1
                              ) -> list[CompletionResponseChoice]:
    """One DELTA engine output -> the streamed choices it becomes (logprobs are attached by the caller).

    Sample `c.index` of prompt `prompt_index` is choice `prompt_index * n + c.index`; a sample with no new
    text, no new tokens and no finish reason sends nothing; the sample's last choice carries its
    finish_reason (and stop_reason), as vLLM's OpenAIServingCompletion.completion_stream_generator.
    """
    choices = []
    for completion in output.outputs:
        if not completion.text and not completion.token_ids and completion.finish_reason is None:
            continue
        choices.append(CompletionResponseChoice(
            index=prompt_index * n + completion.index, text=completion.text,
            finish_reason=completion.finish_reason, stop_reason=completion.stop_reason))
    return choices


class OpenAIServingCompletion(OpenAIServing):
    """The /v1/completions handler."""

    def prompts(self, request: CompletionRequest) -> list[Any]:
        prompt = request.prompt
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif len(prompt) > 0 and all(isinstance(p, int) for p in prompt):
            items = [{"prompt_token_ids": list(prompt)}]
        elif len(prompt) > 0 and all(isinstance(p, str) for p in prompt):
            items = list(prompt)
        elif len(prompt) > 0 and all(isinstance(p, list) for p in prompt):
            items = [{"prompt_token_ids": list(p)} for p in prompt]
        else:
            raise OpenAIError("prompt must be a str, a list of str, a list of token ids or a list of such lists "
                              "(and not empty)", param="prompt")
        items = [p if isinstance(p, dict) else {"prompt": p} for p in items]
        if request.cache_salt is not None:
            items = [dict(p, cache_salt=request.cache_salt) for p in items]
        return items

    async def create_completion(self, request: CompletionRequest) -> CompletionResponse | AsyncGenerator[str, None]:
        self.check_model(request.model)
        if request.echo:
            raise OpenAIError("echo is not supported by mini", param="echo")
        if request.suffix is not None:
            raise OpenAIError("suffix is not supported by mini", param="suffix")
        self.sampling_params(request)   # every field checked before any tokenizing
        prompts = await self.tokenized(self.prompts(request))
        params = [self.params_for_prompt(request, len(p["prompt_token_ids"]), "prompt") for p in prompts]
        request_id = random_id("cmpl")
        model_name = request.model or self.served_model_names[0]
        started = await self.start_streams(prompts, params, request_id, request.priority,
                                           self.lora_request(request.model))
        streams = [self.with_first(first, rest) for first, rest in started]
        if request.stream:
            return self._stream(request, streams, request_id, model_name, request.n)
        return await self._full(streams, request_id, model_name, request.n)

    async def tokenized(self, prompts: list[Any]) -> list[dict[str, Any]]:
        """Each prompt as a {"prompt_token_ids", ...} dict: text is tokenized on the renderer's thread."""
        result = []
        for prompt in prompts:
            if "prompt_token_ids" not in prompt:
                self.tokenizer()   # 400 when the server has none
                prompt = dict(prompt, prompt_token_ids=await self.renderer.encode(prompt["prompt"]))
            result.append(prompt)
        return result

    async def _full(self, streams, request_id: str, model_name: str, n: int) -> CompletionResponse:
        texts: dict[int, CompletionOutput] = {}
        prompt_tokens = [0] * len(streams)
        tokenizer = self.engine.tokenizer
        async for prompt_index, output in merge_async_iterators(*streams):
            prompt_tokens[prompt_index] = len(output.prompt_token_ids or [])
            for completion in output.outputs:
                key = prompt_index * n + completion.index
                old = texts.get(key)
                if old is not None:
                    completion = CompletionOutput(
                        completion.index, old.text + completion.text, old.token_ids + list(completion.token_ids),
                        completion.cumulative_logprob,
                        None if completion.logprobs is None else (old.logprobs or []) + list(completion.logprobs),
                        completion.finish_reason, completion.stop_reason)
                texts[key] = completion
        choices = [
            CompletionResponseChoice(
                index=key, text=c.text, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                logprobs=None if c.logprobs is None else completion_logprobs(c.logprobs, c.token_ids, tokenizer))
            for key, c in sorted(texts.items())
        ]
        num_completion = sum(len(c.token_ids) for c in texts.values())
        return CompletionResponse(id=request_id, model=model_name, choices=choices,
                                  usage=self.usage(sum(prompt_tokens), num_completion))

    async def _stream(self, request: CompletionRequest, streams, request_id: str, model_name: str,
                      n: int) -> AsyncGenerator[str, None]:
        prompt_tokens = [0] * len(streams)
        completion_tokens = 0
        offsets: dict[int, int] = {}
        tokenizer = self.engine.tokenizer
        try:
            async for prompt_index, output in merge_async_iterators(*streams):
                prompt_tokens[prompt_index] = len(output.prompt_token_ids or [])
                by_index = {prompt_index * n + c.index: c for c in output.outputs}
                for choice in completion_stream_choices(output, prompt_index, n):
                    completion = by_index[choice.index]
                    completion_tokens += len(completion.token_ids)
                    if completion.logprobs is not None:
                        choice.logprobs = completion_logprobs(completion.logprobs, completion.token_ids, tokenizer,
                                                              offsets.get(choice.index, 0))
                    offsets[choice.index] = offsets.get(choice.index, 0) + len(completion.text)
                    yield sse(CompletionStreamResponse(id=request_id, model=model_name, choices=[choice]))
            if request.stream_options is not None and request.stream_options.include_usage:
                yield sse(CompletionStreamResponse(id=request_id, model=model_name, choices=[],
                                                   usage=self.usage(sum(prompt_tokens), completion_tokens)))
        except Exception as error:  # noqa: BLE001  (mid-stream: an error event, then [DONE], as vLLM)
            yield sse(OpenAIError(f"the request failed: {error}", 500, "InternalServerError").to_response())
        finally:
            for stream in streams:
                await stream.aclose()
        yield SSE_DONE
