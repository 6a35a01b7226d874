"""Mirrors vllm/v1/spec_decode/metadata.py: which rows of the flat batch judge which draft token.

A request scheduled `1 + k` tokens (its last sampled token x, then drafts d1..dk) owns the last `1 + k`
rows of its part of the flat batch. Row j (0-based) holds the hidden state after reading x, d1, ..., dj,
so its logits are the target's prediction for the token after dj: row 0 verifies d1, ..., row k-1
verifies dk (vLLM's `target_logits_indices`), and row k predicts the bonus token, used when all k drafts
are accepted. Row k is the request's last scheduled token, so its logits are the ordinary ones the step
computes anyway (vLLM's `bonus_logits_indices`).

vLLM lists every request of the batch (with 0 drafts where it has none); mini lists only the requests
with drafts: the sampler alone samples the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class SpecDecodeMetadata:
    """The requests with drafts this step: their batch rows, drafts, and the flat rows that verify them."""

    rows: list[int]                     # batch rows of the requests with drafts, ascending
    draft_token_ids: list[list[int]]    # their drafts, one list per entry of `rows`
    target_logits_indices: list[int]    # flat hidden-state row of every draft position, request by request

    @classmethod
    def build(cls, spec_token_ids: Sequence[Sequence[int]], query_start_loc: torch.Tensor
              ) -> SpecDecodeMetadata | None:
        """`spec_token_ids[row]`: the drafts scheduled for batch row `row`. None when no row has drafts (then
        nothing is read back from `query_start_loc`)."""
        rows = [row for row, drafts in enumerate(spec_token_ids) if drafts]
        if not rows:
            return None
        drafts = [list(spec_token_ids[row]) for row in rows]
        starts = query_start_loc.tolist()
        bonus_rows = [starts[row + 1] - 1 for row in rows]
        target = [index for bonus, d in zip(bonus_rows, drafts, strict=False) for index in range(bonus - len(d), bonus)]
        return cls(rows=rows, draft_token_ids=drafts, target_logits_indices=target)

    @property
    def num_draft_tokens(self) -> list[int]:
        return [len(drafts) for drafts in self.draft_token_ids]

    @property
    def max_spec_len(self) -> int:
        return max(self.num_draft_tokens)

    @property
    def draft_starts(self) -> list[int]:
        """Where each request's drafts start in the flat draft order (`target_logits_indices`, target logits)."""
        starts = [0]
        for count in self.num_draft_tokens[:-1]:
            starts.append(starts[-1] + count)
        return starts

    def flat_draft_token_ids(self, device: torch.device | str) -> torch.Tensor:
        """int64 [T]: every request's drafts back to back (T = sum of `num_draft_tokens`)."""
        flat = [token for drafts in self.draft_token_ids for token in drafts]
        return torch.as_tensor(flat, dtype=torch.int64, device=device)
