"""Mirrors vllm/v1/engine/logprobs.py: turn the runner's raw logprobs into vLLM's user-facing format.

The model runner hands over, per new token, a dict `token_id -> logprob` (the sampled token plus the
top-k alternatives). Users get, per token, a dict `token_id -> Logprob(logprob, rank, decoded_token)`,
plus the running sum of the sampled tokens' logprobs (`cumulative_logprob`).

Accepted values in the runner's dicts: a float (rank = 1 + how many entries of the dict are more likely,
exact for the top-k entries), a `(logprob, rank)` pair, or a `Logprob`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mini.outputs import Logprob, PromptLogprobs, SampleLogprobs


def _as_logprob_and_rank(value: Any) -> tuple[float, int | None]:
    if isinstance(value, Logprob):
        return float(value.logprob), value.rank
    if isinstance(value, (tuple, list)):
        return float(value[0]), (None if value[1] is None else int(value[1]))
    return float(value), None


def decode_token(tokenizer: Any | None, token_id: int) -> str | None:
    """The text of one token on its own (vLLM: tokenizer.decode([token_id])); None without a tokenizer."""
    if tokenizer is None:
        return None
    return tokenizer.decode([token_id])


def make_logprob_dict(tokenizer: Any | None, raw: dict[int, Any]) -> dict[int, Logprob]:
    """Runner dict (token_id -> float | (float, rank) | Logprob) -> dict[token_id, Logprob]."""
    pairs = {int(token_id): _as_logprob_and_rank(value) for token_id, value in raw.items()}
    all_logprobs = [logprob for logprob, _ in pairs.values()]
    result: dict[int, Logprob] = {}
    for token_id, (logprob, rank) in pairs.items():
        if rank is None:
            rank = 1 + sum(1 for other in all_logprobs if other > logprob)
        result[token_id] = Logprob(logprob=logprob, rank=rank, decoded_token=decode_token(tokenizer, token_id))
    return result


class LogprobsProcessor:
    """Accumulates one request's sample and prompt logprobs across steps."""

    def __init__(self, tokenizer: Any | None, num_logprobs: int | None, num_prompt_logprobs: int | None) -> None:
        self.tokenizer = tokenizer
        self.logprobs: SampleLogprobs | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: PromptLogprobs | None = None if num_prompt_logprobs is None else []

    def update_sample_logprobs(
        self, new_token_ids: Sequence[int], new_logprobs: Sequence[dict[int, Any]] | None
    ) -> None:
        if self.logprobs is None or not new_logprobs:
            return
        if len(new_logprobs) != len(new_token_ids):
            raise ValueError(
                f"new_logprobs must hold one dict per new token: got {len(new_logprobs)} dicts "
                f"for {len(new_token_ids)} tokens"
            )
        for token_id, raw in zip(new_token_ids, new_logprobs, strict=False):
            entry = make_logprob_dict(self.tokenizer, raw)
            if token_id not in entry:
                raise ValueError(f"logprobs for a step must include the sampled token {token_id}")
            self.logprobs.append(entry)
            self.cumulative_logprob += entry[token_id].logprob

    def update_prompt_logprobs(self, new_prompt_logprobs: Sequence[dict[int, Any] | None] | None) -> None:
        """Append one chunk (chunked prefill sends several). The first prompt token has no logprob: None."""
        if self.prompt_logprobs is None or not new_prompt_logprobs:
            return
        if not self.prompt_logprobs and new_prompt_logprobs[0] is not None:
            self.prompt_logprobs.append(None)
        for raw in new_prompt_logprobs:
            self.prompt_logprobs.append(None if raw is None else make_logprob_dict(self.tokenizer, raw))

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """For DELTA outputs: hand the prompt logprobs out once, then forget them."""
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is not None:
            self.prompt_logprobs = []
        return prompt_logprobs
