"""Mirrors vllm/v1/sample/ops/topk_topp_sampler.py: branch-free top-k / top-p over a whole batch.

Every row carries its own `k` and `p`; there is no Python loop over rows. The trick is to sort each
row once (ascending) and express both cuts as per-row thresholds on the sorted values:

* top-k keeps the tokens whose logit is >= the k-th largest logit of the row (ties are kept),
* top-p keeps the smallest set of most likely tokens whose probability mass reaches `p`: in ascending
  order a token is dropped while the cumulative mass *up to and including it* is <= 1 - p, so the token
  that crosses the boundary is kept, and the most likely token is always kept.

Rows whose `k` is off (<= 0 or >= vocab) and whose `p` is 1 are left bit-identical. Rows that are
already mostly or entirely -inf (a grammar mask) stay free of NaN: comparisons with NaN are False,
so nothing extra is masked.
"""

from __future__ import annotations

import torch


def _validate(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_rows, vocab_size], got shape {tuple(logits.shape)}")
    for name, values in (("k", k), ("p", p)):
        if values is not None and values.shape != (logits.shape[0],):
            raise ValueError(f"{name} must be None or a tensor of shape [{logits.shape[0]}], "
                             f"got shape {tuple(values.shape)}")


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k without a full sort: one `topk` with the batch's largest k (vLLM's apply_top_k_only).

    Modifies `logits` in place and returns it. A `k` <= 0 or >= vocab_size means "off" for that row.
    """
    vocab_size = logits.shape[1]
    k = k.to(device=logits.device, dtype=torch.long)
    row_is_off = (k <= 0) | (k >= vocab_size)
    if bool(row_is_off.all()):
        return logits
    k = k.masked_fill(row_is_off, 1)
    max_top_k = int(k.max())
    kth_largest = logits.topk(max_top_k, dim=1).values.gather(1, (k - 1).unsqueeze(1))
    kth_largest.masked_fill_(row_is_off.unsqueeze(1), -float("inf"))
    return logits.masked_fill_(logits < kth_largest, -float("inf"))


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top-k set and top-p nucleus.

    `k`: None or int tensor [N] (<= 0 or >= vocab_size: off for that row).
    `p`: None or float tensor [N] in (0, 1] (1: off for that row).
    May modify `logits` in place; returns the masked logits.
    """
    _validate(logits, k, p)
    if p is None:
        return logits if k is None else apply_top_k_only(logits, k)

    sorted_logits, sorted_index = logits.sort(dim=-1, descending=False)
    vocab_size = logits.shape[1]
    if k is not None:
        k = k.to(device=logits.device, dtype=torch.long)
        k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
        # Ascending order: the k-th largest sits at position vocab_size - k.
        kth_largest = sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth_largest, -float("inf"))

    p = p.to(device=logits.device, dtype=torch.float32)
    # p == 1 must drop nothing, not even tokens whose probability underflows to 0.
    drop_threshold = torch.where(p >= 1.0, -1.0, 1.0 - p).unsqueeze(1)
    cumulative_probs = sorted_logits.softmax(dim=-1)
    torch.cumsum(cumulative_probs, dim=-1, out=cumulative_probs)
    drop = cumulative_probs <= drop_threshold
    drop[:, -1] = False  # the most likely token always survives
    sorted_logits.masked_fill_(drop, -float("inf"))
    return logits.scatter_(dim=-1, index=sorted_index, src=sorted_logits)
