"""Mirrors vllm/v1/sample/ops/penalties.py (and apply_penalties in vllm/model_executor/layers/utils.py).

vLLM semantics, per row:

* repetition penalty r: every token seen in the prompt OR the output so far has its logit divided by r
  if positive, multiplied by r if not (r > 1 discourages repeats, r = 1 is off);
* frequency penalty f: subtract f * (times the token appears in the output);
* presence penalty q: subtract q once if the token appears in the output at all.

Token histories arrive as int64 tensors padded with `vocab_size` (ragged rows, no Python loop).
vLLM builds dense [rows, vocab] count and mask tensors; here only the history positions are touched:
gather the logits of every history token, penalize them, scatter the results back. A token seen
twice is written twice with the same value, so duplicates are harmless; pad slots are pointed at a
real token of their row (or left unpenalized in a row without history) for the same reason.
"""

from __future__ import annotations

import torch


def get_token_bin_counts_and_mask(
    token_ids: torch.Tensor, vocab_size: int, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row token counts [num_rows, vocab_size] and the mask counts > 0 (dense, as vLLM; ids padded)."""
    counts = torch.zeros((num_rows, vocab_size + 1), dtype=torch.long, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def apply_all_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalize `logits` [N, V] in place and return it. Ids [N, L] are padded with V; penalties are [N]."""
    vocab_size = logits.shape[1]
    history = torch.cat((prompt_token_ids, output_token_ids), dim=1)
    is_pad = history >= vocab_size
    has_history = ~is_pad.all(dim=1, keepdim=True)
    first_real = history.gather(1, (~is_pad).to(torch.int8).argmax(dim=1, keepdim=True))
    slots = torch.where(is_pad, torch.where(has_history, first_real, 0), history)

    # Occurrences of each history token in the output: binary search in the sorted output rows.
    sorted_output = output_token_ids.sort(dim=1).values
    counts = (torch.searchsorted(sorted_output, slots, right=True)
              - torch.searchsorted(sorted_output, slots, right=False)).to(logits.dtype)

    values = logits.gather(1, slots)
    repetition = torch.where(has_history, repetition_penalties.unsqueeze(1), 1.0)
    values = torch.where(values > 0, values / repetition, values * repetition)
    values -= frequency_penalties.unsqueeze(1) * counts
    values -= presence_penalties.unsqueeze(1) * (counts > 0)
    return logits.scatter_(1, slots, values)
