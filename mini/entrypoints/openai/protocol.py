"""Pydantic models of the OpenAI API's requests and responses, and their mapping to `SamplingParams`.

Mirrors vllm/entrypoints/openai/completion/protocol.py (`CompletionRequest`, `CompletionResponse`, ...) and
vllm/entrypoints/openai/chat_completion/protocol.py (`ChatCompletionRequest`), with the shared models of
vllm/entrypoints/serve/engine/protocol.py (`ErrorResponse`, `UsageInfo`, `ModelCard`) and
vllm/entrypoints/generate/base/protocol.py (`StreamOptions`); vLLM once kept them all in one
`protocol.py`. The OpenAI fields (`max_tokens`, `temperature`, `top_p`,
`n`, `stop`, `seed`, `logprobs`, `stream_options`, `response_format`, ...) plus vLLM's extra fields
(`top_k`, `min_p`, `repetition_penalty`, `structured_outputs`, `cache_salt`, `priority`, `ignore_eos`,
`min_tokens`, `stop_token_ids`, ...). Unknown fields are accepted and ignored, as vLLM does (it logs them).
`to_sampling_params` builds the engine's `SamplingParams`; its `ValueError`s become 400 responses.
"""

from __future__ import annotations

import time
import uuid
from abc import abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mini.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------------- errors, models, usage
class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "mini"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False


class JsonSchemaFormat(OpenAIBaseModel):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(OpenAIBaseModel):
    """vLLM's `structured_outputs` extra field: exactly one of json / regex / choice / json_object."""

    json_: str | dict | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None


# ---------------------------------------------------------------------------- the sampling fields
class SamplingRequest(OpenAIBaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsRequest | None = None
    cache_salt: str | None = None
    priority: int = 0

    @abstractmethod
    def requested_max_tokens(self) -> int | None:
        """The request's output-length limit (None: fill the context, as vLLM)."""

    @abstractmethod
    def requested_logprobs(self) -> int | None:
        """How many top logprobs per sampled token (None: no logprobs)."""

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """`structured_outputs`, else `response_format` json_schema / json_object, as vLLM maps them."""
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise ValueError("give either response_format or structured_outputs, not both")
        if self.structured_outputs is not None:
            so = self.structured_outputs
            return StructuredOutputsParams(json=so.json_, regex=so.regex, choice=so.choice,
                                           json_object=so.json_object)
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ValueError("response_format.json_schema.schema is required when response_format.type "
                             "is 'json_schema'")
        return StructuredOutputsParams(json=fmt.json_schema.schema_)

    def to_sampling_params(self) -> SamplingParams:
        """The engine's SamplingParams (DELTA output: the server reads every step, then aggregates).

        Raises ValueError naming the bad field (the server answers 400)."""
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            max_tokens=self.requested_max_tokens(),
            min_tokens=self.min_tokens,
            logprobs=self.requested_logprobs(),
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias,
            structured_outputs=self.structured_outputs_params(),
            output_kind=RequestOutputKind.DELTA,
        )


# ---------------------------------------------------------------------------- /v1/completions
class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        return self.logprobs


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


# ---------------------------------------------------------------------------- /v1/chat/completions
class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return (self.top_logprobs or 0) if self.logprobs else None


class ChatTopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(OpenAIBaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
