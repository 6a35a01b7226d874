"""How what crosses the process boundary between the front end and the engine core is encoded.

Mirrors vllm/v1/serial_utils.py (`MsgpackEncoder` / `MsgpackDecoder`: msgspec's msgpack with typed decoding).
The messages themselves (`EngineCoreRequestType`, `EngineCoreOutputType`, `UtilityOutput`, `EngineCoreOutputs`)
are in mini/engine/__init__.py, as vLLM keeps them in vllm/v1/engine/__init__.py; they are re-exported here.

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
from typing import Any

import msgspec

from mini.engine import (  # the messages; re-exported here
    EngineCoreOutputs,
    EngineCoreOutputType,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityOutput,
)
from mini.lora.request import LoRARequest
from mini.metrics.stats import SchedulerStats
from mini.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

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
    if raw.get("lora_request") is not None:
        raw["lora_request"] = LoRARequest(**raw["lora_request"])
    return EngineCoreRequest(**raw)


def scheduler_stats_from_wire(raw: Any) -> SchedulerStats | None:
    """A utility call's `SchedulerStats` result (sent untyped) back as the dataclass."""
    return None if raw is None else msgspec.convert(raw, SchedulerStats)


__all__ = ["EngineCoreOutputType", "EngineCoreOutputs", "EngineCoreRequestType", "UtilityOutput", "decode_any",
           "decode_outputs", "decode_request", "encode", "sampling_params_from_wire", "scheduler_stats_from_wire"]
