"""Mirrors vllm/outputs.py (RequestOutput, CompletionOutput) and vllm/logprobs.py (Logprob).

What `LLM.generate` returns and what each `LLMEngine.step()` yields: one `RequestOutput` per request,
holding one `CompletionOutput` per sample (`n` of them) and, as vLLM's, the `lora_request` it ran with.
Logprobs use vLLM's layout: a list with one entry per token, each a `dict[token_id, Logprob]` holding the
sampled token plus the top-k alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Logprob:
    """Log probability of one token, its rank in the vocabulary (1 = most likely), and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per generated (or prompt) token: token id -> Logprob. Prompt logprobs start with None
# (the first prompt token has no prediction).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a request.

    index: which of the request's `n` samples this is.
    text / token_ids: generated so far (or, for DELTA output, generated since the last output).
    cumulative_logprob: sum of the sampled tokens' logprobs (None if logprobs were not requested).
    finish_reason: None while running, else "stop" | "length" | "abort".
    stop_reason: the stop string or stop token id that ended it (None for EOS or length).
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids}, "
            f"cumulative_logprob={self.cumulative_logprob}, logprobs={self.logprobs}, "
            f"finish_reason={self.finish_reason}, stop_reason={self.stop_reason})"
        )


@dataclass(slots=True)
class RequestOutput:
    """The output of one request: its prompt and its `n` completions, sorted by index."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict | None = field(default=None, repr=False)
    lora_request: Any = None   # the request's LoRARequest (mini/lora/request.py), None for the base model

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, prompt_logprobs={self.prompt_logprobs}, "
            f"outputs={self.outputs}, finished={self.finished}, lora_request={self.lora_request}, "
            f"num_cached_tokens={self.num_cached_tokens})"
        )
