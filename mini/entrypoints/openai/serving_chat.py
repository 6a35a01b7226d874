"""POST /v1/chat/completions: messages in, an assistant message out, whole or streamed.

Mirrors vllm/entrypoints/openai/chat_completion/serving.py (`OpenAIServingChat`). The messages are checked and
rendered by mini/entrypoints/chat_utils.py, as `LLM.chat` does, on the renderer's thread
(mini/entrypoints/openai/renderer.py): with the request's `chat_template` (only with
`--trust-request-chat-template`, as vLLM), else the tokenizer's own (SmolLM2's ChatML template, for instance), else
`FALLBACK_CHAT_TEMPLATE`, the documented one-line-per-message template the shipped tiny model gets:

    system: You are terse.
    user: Hi
    assistant:

Streamed, the first chunk of each choice carries `delta.role = "assistant"` (and empty content), then
one chunk per engine output with the new `delta.content`; the last carries `finish_reason`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from mini.entrypoints.chat_utils import normalize_conversation
from mini.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
    DeltaMessage,
    random_id,
)
from mini.entrypoints.openai.renderer import UntrustedChatTemplate
from mini.entrypoints.openai.serving_engine import SSE_DONE, OpenAIError, OpenAIServing, sse
from mini.entrypoints.template_fuel import TemplateFuelExhausted
from mini.outputs import SampleLogprobs


def chat_logprobs(logprobs: SampleLogprobs, token_ids: list[int], tokenizer: Any, top_n: int) -> ChatChoiceLogprobs:
    """vLLM's per-token logprobs -> OpenAI's chat layout: content[i] = {token, logprob, bytes, top_logprobs}."""

    def text_of(tid: int, entry: Any) -> str:
        if entry is not None and entry.decoded_token is not None:
            return entry.decoded_token
        return tokenizer.decode([tid]) if tokenizer is not None else f"token_id:{tid}"

    content = []
    for token_id, candidates in zip(token_ids, logprobs, strict=False):
        sampled = candidates.get(token_id)
        token = text_of(token_id, sampled)
        ranked = sorted(candidates.items(), key=lambda item: -item[1].logprob)[:top_n]
        content.append(ChatTokenLogprob(
            token=token, logprob=-9999.0 if sampled is None else max(sampled.logprob, -9999.0),
            bytes=list(token.encode()),
            top_logprobs=[ChatTopLogprob(token=text_of(tid, lp), logprob=max(lp.logprob, -9999.0),
                                         bytes=list(text_of(tid, lp).encode())) for tid, lp in ranked]))
    return ChatChoiceLogprobs(content=content)


class OpenAIServingChat(OpenAIServing):
    """The /v1/chat/completions handler."""

    async def render(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """The prompt dict for the engine: the messages rendered and tokenized on the renderer's thread."""
        self.tokenizer()   # 400 when the server has none
        try:
            conversation = normalize_conversation([message.model_dump() for message in request.messages])
            text, token_ids = await self.renderer.render_chat(
                conversation, request.chat_template, request.add_generation_prompt,
                request.continue_final_message, request.chat_template_kwargs)
        except UntrustedChatTemplate as error:
            raise OpenAIError(str(error), param="chat_template") from error
        except (TemplateFuelExhausted, TimeoutError) as error:
            raise OpenAIError(str(error), param="chat_template") from error
        except (ValueError, TypeError) as error:
            raise OpenAIError(str(error), param="messages") from error
        except Exception as error:  # a template that fails to render (jinja errors)
            raise OpenAIError(f"the chat template failed to render: {error}", param="messages") from error
        prompt: dict[str, Any] = {"prompt": text, "prompt_token_ids": token_ids}
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        return prompt

    async def create_chat_completion(self, request: ChatCompletionRequest
                                     ) -> ChatCompletionResponse | AsyncGenerator[str, None]:
        self.check_model(request.model)
        try:
            self.renderer.check_template_trust(request.chat_template, request.chat_template_kwargs)
        except UntrustedChatTemplate as error:
            raise OpenAIError(str(error), param="chat_template") from error
        self.sampling_params(request)   # every field checked before any rendering
        prompt = await self.render(request)
        params = self.params_for_prompt(request, len(prompt["prompt_token_ids"]), "messages")
        request_id = random_id("chatcmpl")
        model_name = request.model or self.served_model_names[0]
        [(first, rest)] = await self.start_streams([prompt], [params], request_id, request.priority,
                                                  self.lora_request(request.model))
        stream = self.with_first(first, rest)
        top_n = request.top_logprobs or 0
        if request.stream:
            return self._stream(request, stream, request_id, model_name, top_n)
        return await self._full(stream, request_id, model_name, top_n)

    async def _full(self, stream, request_id: str, model_name: str, top_n: int) -> ChatCompletionResponse:
        texts: dict[int, str] = {}
        token_ids: dict[int, list[int]] = {}
        logprobs: dict[int, SampleLogprobs | None] = {}
        finish: dict[int, tuple[str | None, int | str | None]] = {}
        num_prompt_tokens = 0
        async for output in stream:
            num_prompt_tokens = len(output.prompt_token_ids or [])
            for c in output.outputs:
                texts[c.index] = texts.get(c.index, "") + c.text
                token_ids[c.index] = token_ids.get(c.index, []) + list(c.token_ids)
                if c.logprobs is not None:
                    logprobs[c.index] = (logprobs.get(c.index) or []) + list(c.logprobs)
                finish[c.index] = (c.finish_reason, c.stop_reason)
        tokenizer = self.engine.tokenizer
        choices = [
            ChatCompletionResponseChoice(
                index=i, message=ChatMessage(role="assistant", content=texts[i]),
                finish_reason=finish[i][0], stop_reason=finish[i][1],
                logprobs=(None if logprobs.get(i) is None
                          else chat_logprobs(logprobs[i], token_ids[i], tokenizer, top_n)))
            for i in sorted(texts)
        ]
        return ChatCompletionResponse(id=request_id, model=model_name, choices=choices, usage=self.usage(
            num_prompt_tokens, sum(len(ids) for ids in token_ids.values())))

    async def _stream(self, request: ChatCompletionRequest, stream, request_id: str, model_name: str,
                      top_n: int) -> AsyncGenerator[str, None]:
        num_prompt_tokens = 0
        num_completion_tokens = 0
        announced: set[int] = set()
        tokenizer = self.engine.tokenizer
        try:
            async for output in stream:
                num_prompt_tokens = len(output.prompt_token_ids or [])
                for c in output.outputs:
                    if c.index not in announced:
                        announced.add(c.index)
                        yield sse(ChatCompletionStreamResponse(id=request_id, model=model_name, choices=[
                            ChatCompletionResponseStreamChoice(index=c.index,
                                                               delta=DeltaMessage(role="assistant", content=""))]))
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    num_completion_tokens += len(c.token_ids)
                    yield sse(ChatCompletionStreamResponse(id=request_id, model=model_name, choices=[
                        ChatCompletionResponseStreamChoice(
                            index=c.index, delta=DeltaMessage(content=c.text), finish_reason=c.finish_reason,
                            stop_reason=c.stop_reason,
                            logprobs=None if c.logprobs is None else chat_logprobs(c.logprobs, c.token_ids,
                                                                                   tokenizer, top_n))]))
            if request.stream_options is not None and request.stream_options.include_usage:
                yield sse(ChatCompletionStreamResponse(id=request_id, model=model_name, choices=[],
                                                       usage=self.usage(num_prompt_tokens, num_completion_tokens)))
        except Exception as error:  # noqa: BLE001  (mid-stream: an error event, then [DONE], as vLLM)
            yield sse(OpenAIError(f"the request failed: {error}", 500, "InternalServerError").to_response())
        finally:
            await stream.aclose()
        yield SSE_DONE
