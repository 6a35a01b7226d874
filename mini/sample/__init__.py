"""Mirrors vllm/v1/sample/: turning a batch of logits into next tokens.

`SamplingMetadata.build(...)` packs the rows' SamplingParams; `Sampler()(logits, metadata)` returns a
`SamplerOutput` (token ids + optional `LogprobsTensors`).
"""

from __future__ import annotations

from mini.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs, logprobs_to_dicts
from mini.sample.metadata import SamplingMetadata
from mini.sample.sampler import Sampler, SamplerOutput

__all__ = [
    "LogprobsTensors",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "compute_logprobs",
    "gather_logprobs",
    "logprobs_to_dicts",
]
