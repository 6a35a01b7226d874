"""Mirrors vllm/v1/request.py: one generation request as the scheduler sees it.

A `Request` is the engine core's record of a sequence: its prompt, the tokens sampled so far, how
many of its tokens already have KV in the cache (`num_computed_tokens`) and where it is in its life
(`status`). The scheduler never distinguishes "prefill" from "decode": it only compares
`num_tokens` with `num_computed_tokens`.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from mini.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from mini.engine import EngineCoreRequest
    from mini.lora.request import LoRARequest
    from mini.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Life cycle of a request. Every status after PREEMPTED is a finished one (as in vLLM)."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()  # structured output: grammar still compiling
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()  # the grammar refused a token (vLLM: any request-level error)

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISHED_REASONS.get(status)


_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """A prompt plus its generated tokens, with the bookkeeping the scheduler needs."""

    __slots__ = (
        "all_token_ids",
        "arrival_time",
        "cache_salt",
        "eos_token_id",
        "lora_request",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_output_placeholders",
        "num_preemptions",
        "output_token_ids",
        "priority",
        "prompt_token_ids",
        "request_id",
        "sampling_params",
        "skip_reading_prefix_cache",
        "spec_token_ids",
        "status",
        "stop_reason",
        "structured_output_request",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt_token_ids must hold at least one token, got an empty prompt")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        # Prefix-cache namespace (vLLM: Request.cache_salt): only requests with the same salt share blocks.
        self.cache_salt = cache_salt
        # The LoRA adapter (mini/lora/; vLLM: Request.lora_request): the scheduler counts distinct ones per step.
        self.lora_request = lora_request
        # vLLM (`Request.get_skip_reading_prefix_cache` in vllm/v1/request.py): SamplingParams'
        # `skip_reading_prefix_cache` when set, else True for a request asking for prompt logprobs (its cached
        # tokens would get none). Such a request still writes its blocks to the cache.
        skip = getattr(sampling_params, "skip_reading_prefix_cache", None)
        self.skip_reading_prefix_cache = (getattr(sampling_params, "prompt_logprobs", None) is not None
                                          if skip is None else bool(skip))
        self.output_token_ids: list[int] = []
        # Speculative decoding: draft tokens proposed after the last step, verified in the next one.
        self.spec_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Async scheduling (mini/core/sched/async_scheduler.py): tokens scheduled to be sampled by steps still
        # in flight; `num_computed_tokens` already counts them as inputs of the next step (vLLM: the same name).
        self.num_output_placeholders = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        # Prefix-cache hit length the first time the request was scheduled (-1: not scheduled yet).
        self.num_cached_tokens = -1
        # Structured output: the grammar state; WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR until it is compiled.
        self.structured_output_request = StructuredOutputRequest.from_sampling_params(sampling_params)
        if self.structured_output_request is not None:
            self.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR

    @classmethod
    def from_engine_core_request(cls, core_request: EngineCoreRequest) -> Request:
        """Build from the input processor's EngineCoreRequest."""
        return cls(
            request_id=core_request.request_id,
            prompt_token_ids=core_request.prompt_token_ids,
            sampling_params=core_request.sampling_params,
            eos_token_id=core_request.eos_token_id,
            arrival_time=core_request.arrival_time,
            priority=core_request.priority,
            cache_salt=core_request.cache_salt,
            lora_request=core_request.lora_request,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Tokens plus the draft tokens waiting to be verified (vLLM: `Request.num_tokens_with_spec`)."""
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        new_ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        self.output_token_ids.extend(new_ids)
        self.all_token_ids.extend(new_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
