"""Mirrors vllm/v1/sample/: turning a batch of logits into next tokens.

`SamplingMetadata.build(...)` packs the rows' SamplingParams; `Sampler()(logits, metadata)` returns a
`SamplerOutput` (token ids + optional `LogprobsTensors`). `rejection_sample` verifies speculative drafts.
"""

from __future__ import annotations

from mini.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs, logprobs_to_dicts
from mini.sample.metadata import SamplingMetadata
from mini.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler, rejection_sample
from mini.sample.sampler import Sampler, SamplerOutput

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "LogprobsTensors",
    "RejectionSampler",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "compute_logprobs",
    "gather_logprobs",
    "logprobs_to_dicts",
    "rejection_sample",
]
