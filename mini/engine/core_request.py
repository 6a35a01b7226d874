"""Mirrors vllm/v1/engine/__init__.py (EngineCoreRequest): a validated, tokenized request.

The input processor turns a user prompt into this record; the engine builds the scheduler's `Request`
from it and the output processor keeps its prompt for the `RequestOutput`. vLLM defines the class in
`vllm/v1/engine/__init__.py`; mini keeps it in its own small module so importing it stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

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
