"""Punica-style LoRA in plain torch: every token's adapter slot, then one small matmul pair per slot.

Mirrors vllm/lora/ops/torch_ops/lora_ops.py (`bgmv_shrink` / `bgmv_expand`, used by
vllm/lora/punica_wrapper/punica_cpu.py). vLLM's torch ops gather each token's own A and B (`lora_a[indices]`,
a `[T, r, in]` copy) and run one batched einsum; mini groups the tokens by slot instead (vLLM's "sgmv", segmented
by adapter): at most `max_loras` slots are active in a step, so a step costs at most `max_loras` pairs of plain
matmuls per layer and copies no weights. Slot -1 means "no adapter": those rows are left as they are.

    shrink:  buffer[t] = x[t] @ lora_a[slot[t]].T          [T, in] -> [T, r]
    expand:  out[t]   += buffer[t] @ lora_b[slot[t]].T      [T, r]  -> [T, out]   (B already holds the scaling)
"""

from __future__ import annotations

import torch


def group_tokens(token_slots: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """`[(slot, token indices)]` for each slot in use; indices None when every token uses that one slot."""
    slots = sorted(int(s) for s in torch.unique(token_slots).tolist() if s >= 0)
    if len(slots) == 1 and bool((token_slots == slots[0]).all()):
        return [(slots[0], None)]
    return [(slot, torch.nonzero(token_slots == slot).flatten()) for slot in slots]


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, groups: list[tuple[int, torch.Tensor | None]]
                ) -> list[torch.Tensor]:
    """For each group, its tokens' `x @ A[slot].T` (`lora_a`: `[max_loras, max_rank, in]`)."""
    return [(x if rows is None else x[rows]) @ lora_a[slot].T for slot, rows in groups]


def lora_expand(out: torch.Tensor, shrunk: list[torch.Tensor], lora_b: torch.Tensor,
                groups: list[tuple[int, torch.Tensor | None]]) -> torch.Tensor:
    """`out[rows] += shrunk @ B[slot].T` for each group, in place (`lora_b`: `[max_loras, out, max_rank]`)."""
    for (slot, rows), buffer in zip(groups, shrunk, strict=True):
        delta = buffer @ lora_b[slot].T
        if rows is None:
            out += delta
        else:
            out.index_add_(0, rows, delta)
    return out


def add_lora_reference(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       token_slots: torch.Tensor) -> torch.Tensor:
    """The per-token definition, one token at a time (for tests): `out[t] += B[s] @ (A[s] @ x[t])`, s >= 0."""
    out = out.clone()
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            out[t] += lora_b[slot] @ (lora_a[slot] @ x[t])
    return out
