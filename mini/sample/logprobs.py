"""Mirrors vllm/v1/outputs.py (LogprobsTensors) and the logprob helpers of vllm/v1/sample/sampler.py.

The sampler reports, per row, the log-probability of the token it sampled plus the row's top-N
alternatives, computed from the *raw* logits (vLLM's default `logprobs_mode="raw_logprobs"`): before
penalties, processors, temperature or truncation touch them.

Layout (as vLLM): column 0 is the sampled token, columns 1..N are the top-N tokens, best first.
`selected_token_ranks[i]` is the 1-based rank of the sampled token in its row (1 = the most likely).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LogprobsTensors:
    """Top-N logprobs per row; column 0 holds the sampled (or target) token."""

    logprob_token_ids: torch.Tensor  # int64 [N, k + 1]
    logprobs: torch.Tensor  # float32 [N, k + 1]
    selected_token_ranks: torch.Tensor  # int64 [N]

    def tolists(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Plain Python lists: (token ids, logprobs, ranks)."""
        return (self.logprob_token_ids.tolist(), self.logprobs.tolist(), self.selected_token_ranks.tolist())


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the vocabulary, in float32 (vllm/v1/sample/sampler.py: compute_logprobs)."""
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor) -> LogprobsTensors:
    """Top-`num_logprobs` entries of each row plus the logprob and rank of `token_ids[row]`.

    Mirrors vllm/v1/sample/sampler.py `gather_logprobs`. `num_logprobs` may be 0 (only the chosen
    token) or -1 (the whole vocabulary). The rank counts tokens at least as likely as the chosen one,
    so ties share the worse rank, as in vLLM's `batched_count_greater_than`.
    """
    if num_logprobs < -1:
        raise ValueError(f"num_logprobs must be -1 (whole vocabulary) or >= 0, got {num_logprobs}")
    if num_logprobs == -1:
        num_logprobs = logprobs.shape[-1]
    token_ids = token_ids.to(torch.int64).view(-1, 1)
    token_logprobs = logprobs.gather(-1, token_ids)
    token_ranks = (logprobs >= token_logprobs).sum(dim=-1)
    if num_logprobs > 0:
        top_logprobs, top_token_ids = torch.topk(logprobs, num_logprobs, dim=-1)
        token_ids = torch.cat((token_ids, top_token_ids), dim=1)
        token_logprobs = torch.cat((token_logprobs, top_logprobs), dim=1)
    return LogprobsTensors(token_ids, token_logprobs, token_ranks)


def logprobs_to_dicts(
    tensors: LogprobsTensors, num_logprobs: list[int | None]
) -> list[dict[int, float] | None]:
    """One `{token_id: logprob}` dict per row: the row's own top-N plus its sampled token.

    `num_logprobs[row]` is that request's `SamplingParams.logprobs` (None: the row asked for none,
    -1: the whole vocabulary). Rows of one batch may ask for different N; the tensors hold the max.
    """
    if len(num_logprobs) != tensors.logprob_token_ids.shape[0]:
        raise ValueError(
            f"num_logprobs must have one entry per row ({tensors.logprob_token_ids.shape[0]}), "
            f"got {len(num_logprobs)}"
        )
    token_id_rows, logprob_rows, _ = tensors.tolists()
    width = len(token_id_rows[0]) - 1 if token_id_rows else 0
    dicts: list[dict[int, float] | None] = []
    for row, wanted in enumerate(num_logprobs):
        if wanted is None:
            dicts.append(None)
            continue
        top_n = width if wanted == -1 else min(wanted, width)
        ids, values = token_id_rows[row], logprob_rows[row]
        entry = {ids[0]: values[0]}
        for col in range(1, top_n + 1):
            entry.setdefault(ids[col], values[col])
        dicts.append(entry)
    return dicts
