"""What crosses the process boundary between the front end and the engine core, and how it is encoded.

Mirrors vllm/v1/engine/__init__.py (`EngineCoreRequestType`, `EngineCoreOutputs`, `UtilityOutput`) and
vllm/v1/serial_utils.py (`MsgpackEncoder` / `MsgpackDecoder`: msgspec's msgpack with typed decoding). Why it sits in
engine/ (vLLM's sits one level up): every type it encodes is the engine's, and only the engine's clients and
core process use it; one level up it would import engine/ and engine/ it, a circle.

Where mini differs, and why:
* `EngineCoreRequest` and `EngineCoreOutput` (mini/engine/__init__.py) stay slotted dataclasses, as the rest
  of mini builds and copies them (`dataclasses.replace`, positional construction in the course); msgspec
  encodes dataclasses natively, so only the envelope `EngineCoreOutputs` is a `msgspec.Struct`.
* `SamplingParams` is rebuilt field by field, without running `__post_init__`: msgspec would run it on
  decode, which re-derives the private fields (`_all_stop_token_ids`, `_eos_token_id`, ...) that the input
  processor already filled in. So the core sees exactly the object the front end validated (a test checks
  `decoded == original` for structured outputs, logit_bias, stop strings, seeds, ...).
* vLLM sends tensors as zero-copy extra frames; mini's requests and outputs hold only lists and dicts.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgspec

from mini.engine import EngineCoreOutput, EngineCoreRequest
from mini.metrics.stats import SchedulerStats
from mini.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams


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


# ---------------------------------------------------------------------------- encoding
_encoder = msgspec.msgpack.Encoder()
_outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
_any_decoder = msgspec.msgpack.Decoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_outputs(data: bytes) -> EngineCoreOutputs:
    return _outputs_decoder.decode(data)


def decode_any(data: bytes) -> Any:
    return _any_decoder.decode(data)


def _rebuild(cls: type, raw: dict[str, Any]) -> Any:
    """An instance of dataclass `cls` with exactly the encoded field values (no `__post_init__`)."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            raise ValueError(f"{cls.__name__}: field {f.name!r} missing on the wire")
        object.__setattr__(obj, f.name, raw[f.name])
    return obj


def sampling_params_from_wire(raw: dict[str, Any]) -> SamplingParams:
    params = _rebuild(SamplingParams, raw)
    params.output_kind = RequestOutputKind(raw["output_kind"])
    params._all_stop_token_ids = set(raw["_all_stop_token_ids"])
    if raw["structured_outputs"] is not None:
        params.structured_outputs = _rebuild(StructuredOutputsParams, raw["structured_outputs"])
    return params


def decode_request(data: bytes) -> EngineCoreRequest:
    """An `EngineCoreRequest` as the front end encoded it (`encode(request)`)."""
    raw = _any_decoder.decode(data)
    raw["sampling_params"] = sampling_params_from_wire(raw["sampling_params"])
    return EngineCoreRequest(**raw)


def scheduler_stats_from_wire(raw: Any) -> SchedulerStats | None:
    """A utility call's `SchedulerStats` result (sent untyped) back as the dataclass."""
    return None if raw is None else msgspec.convert(raw, SchedulerStats)
