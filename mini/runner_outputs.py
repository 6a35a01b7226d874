"""What one model-runner step hands back to the scheduler: `ModelRunnerOutput`.

Mirrors vllm/v1/outputs.py (ModelRunnerOutput), which vLLM keeps in a neutral module beside the engine's
layers: the worker produces it and the scheduler reads it, and neither imports the other. vLLM ships
logprobs as tensors (LogprobsLists); mini converts them to plain `{token_id: logprob}` dicts here, one dict
per sampled token, because the batches are small and dicts are what the course prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ModelRunnerOutput:
    """Per scheduled request (in batch-row order): the tokens sampled this step."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    # One list per request: [token] normally, [] for a request still in the middle of its prefill; with
    # speculative decoding, the accepted drafts followed by the target's own token (1 to k + 1 tokens).
    sampled_token_ids: list[list[int]]
    # None when no request of the step asked for logprobs; else per request None (it did not ask)
    # or one {token_id: logprob} dict per sampled token (sampled token first, then its top-N).
    logprobs: list[list[dict[int, float]] | None] | None = None
    # req_id -> one entry per prompt token computed this step: None for the very first prompt token
    # (nothing predicts it), else {prompt_token_id: logprob, top-N...}. Only requests that asked.
    prompt_logprobs: dict[str, list[dict[int, float] | None]] = field(default_factory=dict)
    # Speculative decoding: per request (row order), the draft tokens proposed for the NEXT step ([] for
    # none); None when speculative decoding is off. vLLM hands them over with `take_draft_token_ids()`.
    spec_token_ids: list[list[int]] | None = None

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
