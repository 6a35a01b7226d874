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

The request models are the server's contract (they are the OpenAPI document's request schemas), so they
say what the server accepts: vLLM's own bounds (`seed` and `priority` in int64, prompt token ids >= 0,
at most 4 stop strings as `VLLM_MAX_STOP_STRINGS`, `n` at most 16384 as `VLLM_MAX_N_SEQUENCES`, at most 1024
prompts as `VLLM_MAX_COMPLETION_PROMPTS`, a non-empty `allowed_token_ids` as vllm/sampling_params.py) plus the
ranges `SamplingParams` checks (temperature >= 0, top_p in (0, 1], ...), non-empty prompts and messages,
and the message shape mini reads (mini/entrypoints/chat_utils.py). Every integer is held to int64 (what the
engine core's messages and tensors carry: 2**70 is a 400 naming the field, never an overflow inside the
engine) and every float to a finite value (`NaN` and `Infinity`, which Python's JSON parser reads, are 400s).
`logit_bias` values are clamped to [-100, 100] and `max_tokens` to the room the prompt leaves in the
context (vllm/entrypoints/serve/utils/api_utils.py `get_max_tokens`), as vLLM does, not refused. `best_of` is
no field of vLLM v0.33.0's requests: like any unknown field it is accepted and ignored, whatever its value.
Where mini differs from vLLM: the request models are strict (`"n": "2"` or `"stream": "yes"` is a 400,
where vLLM's lax models coerce them), so that a body the document calls invalid is never served.
"""

from __future__ import annotations

import time
import uuid
from abc import abstractmethod
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from mini.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class RequestModel(OpenAIBaseModel):
    """A request body part: strict types (no str -> int coercion), unknown fields allowed."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1   # vLLM's bounds of seed and priority
MAX_N_SEQUENCES = 16384                     # vLLM's VLLM_MAX_N_SEQUENCES default
MAX_STOP_STRINGS = 4                        # vLLM's VLLM_MAX_STOP_STRINGS default
MAX_COMPLETION_PROMPTS = 1024               # vLLM's VLLM_MAX_COMPLETION_PROMPTS default
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenIdKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,19}$")]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


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
    parent: str | None = None        # a LoRA adapter's base model (vLLM's ModelCard.parent)
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StreamOptions(RequestModel):
    include_usage: bool | None = False


class JsonSchemaFormat(RequestModel):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(RequestModel):
    """vLLM's `structured_outputs` extra field: exactly one of json / regex / choice / json_object."""

    json_: str | dict | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None


# ---------------------------------------------------------------------------- the sampling fields
class SamplingRequest(RequestModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N_SEQUENCES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: Int64 | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[TokenIdKey, Annotated[float, Field(
        description="token id -> bias added to its logit; clamped to [-100, 100], as vLLM")]] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extra sampling fields
    top_k: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsRequest | None = None
    cache_salt: NonEmptyStr | None = None
    priority: Int64 = 0

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

    def to_sampling_params(self, context_room: int | None = None) -> SamplingParams:
        """The engine's SamplingParams (DELTA output: the server reads every step, then aggregates).

        `context_room`: the tokens the prompt leaves in the context; `max_tokens` is clamped to it (absent,
        it is the room itself), as vLLM's `get_max_tokens`. Raises ValueError naming the bad field (400)."""
        max_tokens = self.requested_max_tokens()
        if context_room is not None:
            max_tokens = context_room if max_tokens is None else min(max_tokens, context_room)
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
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            logprobs=self.requested_logprobs(),
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias,
            allowed_token_ids=self.allowed_token_ids,
            structured_outputs=self.structured_outputs_params(),
            output_kind=RequestOutputKind.DELTA,
        )


# ---------------------------------------------------------------------------- /v1/completions
class CompletionRequest(SamplingRequest):
    prompt: (NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_COMPLETION_PROMPTS)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                         Field(min_length=1, max_length=MAX_COMPLETION_PROMPTS)])
    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = 16
    logprobs: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
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


class TextContentPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatCompletionMessageParam(RequestModel):
    """One message as mini reads it: a role of mini/entrypoints/chat_utils.py ROLES, and text content."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextContentPart]


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatCompletionMessageParam], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: Annotated[str, Field(
        description="refused unless the server runs with --trust-request-chat-template, as vLLM")] | None = None
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
