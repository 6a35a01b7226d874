"""Mirrors vllm/v1/engine/__init__.py: the types the engine core takes in and hands out.

`EngineCoreRequest` is a validated, tokenized request: the input processor makes it from a user prompt, the
engine builds the scheduler's `Request` from it and the output processor keeps its prompt for the
`RequestOutput`. `EngineCoreOutput` is what `Scheduler.update_from_output` returns per request that progressed
and what the output processor turns into `RequestOutput`s. Both sit here, below the scheduler and the engine
loop that exchange them, as vLLM keeps them; this module imports nothing of the engine, so the core can
import it. The messages that cross the process boundary (`EngineCoreRequestType`, `EngineCoreOutputType`,
`UtilityOutput`, the envelope `EngineCoreOutputs`) are here too, as in vLLM; mini/serial_utils.py encodes them.
The engine's modules are imported by name (`mini.engine.llm_engine`, ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

from mini.lora.request import LoRARequest
from mini.metrics.stats import SchedulerStats
from mini.sampling_params import SamplingParams


@dataclass(slots=True)
class EngineCoreRequest:
    """One request as the engine core sees it: token ids + (cloned, validated) sampling params."""

    request_id: str
    prompt: str | None                 # the prompt text, or None for a token-id prompt
    prompt_token_ids: list[int]
    sampling_params: SamplingParams    # owned by this request (a clone of the user's object)
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None      # prefix-cache namespace: enters the first block's hash (prompt dict key)
    lora_request: LoRARequest | None = None   # the adapter it runs with (mini/lora/), None: the base model


@dataclass(slots=True)
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None      # "stop" | "length" | "abort" | None
    stop_reason: int | str | None = None  # the stop token id that ended the request, if any
    new_logprobs: Any = None              # one {token_id: logprob} dict per new token, or None
    new_prompt_logprobs: Any = None
    num_cached_tokens: int = 0            # prefix-cache hit length when the request was first scheduled
    # Speculative decoding: drafts verified for this request this step, and how many were accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreRequestType(enum.Enum):
    """The first frame of every message to the engine core (vLLM's `EngineCoreRequestType`)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"


class EngineCoreOutputType(enum.Enum):
    """The first frame of every message from the engine core (mini's; vLLM sends `ENGINE_CORE_DEAD` as a
    bare frame and the handshake on a separate socket)."""

    READY = b"R"             # start-up succeeded: payload = the core's startup_info()
    STARTUP_FAILED = b"F"    # start-up raised: payload = the error text (with its traceback)
    OUTPUTS = b"O"           # an EngineCoreOutputs
    DEAD = b"D"              # the core hit an error it cannot recover from: payload = the error text


class UtilityOutput(msgspec.Struct, omit_defaults=True):
    """The answer to one utility call (vLLM's `UtilityOutput`)."""

    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineCoreOutputs(msgspec.Struct, omit_defaults=True):
    """Everything one engine-core step (or one utility call) hands back to the front end."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    # mini: a step raised; these requests were aborted in the core (id -> the error's text).
    failed_requests: dict[str, str] | None = None
