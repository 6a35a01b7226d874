"""Punica-style LoRA in plain torch, two ways: one matmul pair per adapter slot, or one pair for all slots.

Mirrors vllm/lora/ops/torch_ops/lora_ops.py (`bgmv_shrink` / `bgmv_expand`, used by
vllm/lora/punica_wrapper/punica_cpu.py). vLLM's torch ops gather each token's own A and B (`lora_a[indices]`,
a `[T, r, in]` copy) and run one batched einsum; mini groups the tokens by slot instead (vLLM's "sgmv", segmented
by adapter): at most `max_loras` slots are active in a step, so a step costs at most `max_loras` pairs of plain
matmuls per layer and copies no weights. Slot -1 means "no adapter": those rows are left as they are.

    shrink:  buffer[t] = x[t] @ lora_a[slot[t]].T          [T, in] -> [T, r]
    expand:  out[t]   += buffer[t] @ lora_b[slot[t]].T      [T, r]  -> [T, out]   (B already holds the scaling)

`lora_shrink` / `lora_expand` are the per-token definition in that form (vLLM's "bgmv" ops, each token's A and B
gathered): what the reference punica wrapper runs when a course exercise replaces one of them.

The engine's CPU path (`lora_shrink_stacked` / `lora_expand_stacked`) goes further: every slot's A stacked
into one `[max_loras * r, in]` matrix, so ONE matmul shrinks every token through every slot, a 0/1 mask built
once per step keeps each token's own slot's r columns, and ONE matmul expands: three ops per layer whatever
the mix of adapters. It computes `max_loras` times the shrink and expand FLOPs a token needs, which is small
next to the base projection while `max_loras * r` is small next to its width (4 x 16 = 64 here).
"""

from __future__ import annotations

import torch


def group_tokens(token_slots: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """`[(slot, token indices)]` for each slot in use; indices None when every token uses that one slot."""
    slots = sorted(int(s) for s in torch.unique(token_slots).tolist() if s >= 0)
    if len(slots) == 1 and bool((token_slots == slots[0]).all()):
        return [(slots[0], None)]
    return [(slot, torch.nonzero(token_slots == slot).flatten()) for slot in slots]


def lora_shrink_grouped(x: torch.Tensor, lora_a: torch.Tensor, groups: list[tuple[int, torch.Tensor | None]]
                        ) -> list[torch.Tensor]:
    """For each group, its tokens' `x @ A[slot].T` (`lora_a`: `[max_loras, max_rank, in]`)."""
    return [(x if rows is None else x[rows]) @ lora_a[slot].T for slot, rows in groups]


def lora_expand_grouped(out: torch.Tensor, shrunk: list[torch.Tensor], lora_b: torch.Tensor,
                        groups: list[tuple[int, torch.Tensor | None]]) -> torch.Tensor:
    """`out[rows] += shrunk @ B[slot].T` for each group, in place (`lora_b`: `[max_loras, out, max_rank]`)."""
    for (slot, rows), buffer in zip(groups, shrunk, strict=True):
        delta = buffer @ lora_b[slot].T
        if rows is None:
            out += delta
        else:
            out.index_add_(0, rows, delta)
    return out


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_lora_indices: torch.Tensor,
                scaling: float = 1.0) -> torch.Tensor:
    """`[T, in]` -> `[T, max_rank]`: row t is `scaling * x[t] @ lora_a[s].T` with s its slot, zero for slot -1.

    The readable per-token shrink (vLLM: `bgmv_shrink` in vllm/lora/ops/torch_ops/lora_ops.py, which also takes
    the scaling): what the reference punica wrapper calls, and what the course's phase 16 asks for."""
    has_lora = token_lora_indices >= 0
    selected = lora_a[token_lora_indices.clamp(min=0)]                     # [T, r, in]: each token's own A
    buffer = torch.einsum("ti,tri->tr", x.to(lora_a.dtype), selected) * scaling
    return buffer.masked_fill(~has_lora[:, None], 0.0)


def lora_expand(out: torch.Tensor, buffer: torch.Tensor, lora_b: torch.Tensor, token_lora_indices: torch.Tensor,
                slice_offset: int = 0) -> torch.Tensor:
    """`out[t, slice_offset : slice_offset + n] += buffer[t] @ lora_b[s].T` in place for every token with a slot
    s >= 0 (`lora_b` `[max_loras, n, max_rank]`); rows with slot -1 and columns outside the slice untouched.

    The readable per-token expand (vLLM: `bgmv_expand_slice`, the same file)."""
    has_lora = token_lora_indices >= 0
    selected = lora_b[token_lora_indices.clamp(min=0)]                     # [T, n, r]: each token's own B
    delta = torch.einsum("tr,tnr->tn", buffer.to(lora_b.dtype), selected)
    delta = delta.masked_fill(~has_lora[:, None], 0.0).to(out.dtype)
    out[:, slice_offset:slice_offset + lora_b.shape[1]] += delta
    return out


def add_lora_reference(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       token_slots: torch.Tensor) -> torch.Tensor:
    """The per-token definition, one token at a time (for tests): `out[t] += B[s] @ (A[s] @ x[t])`, s >= 0."""
    out = out.clone()
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            out[t] += lora_b[slot] @ (lora_a[slot] @ x[t])
    return out


def slot_mask(token_slots: torch.Tensor, max_loras: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """`[T, max_loras * rank]`: 1 in the `rank` columns of each token's slot, 0 elsewhere (all 0 for slot -1)."""
    columns = torch.arange(max_loras * rank, device=token_slots.device) // rank
    return (columns[None, :] == token_slots[:, None]).to(dtype)


def lora_shrink_stacked(x: torch.Tensor, lora_a_flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(x @ A_all.T) * mask`, `lora_a_flat` `[max_loras * r, in]`: each token through its own slot only."""
    return torch.mm(x, lora_a_flat.T).mul_(mask)


def lora_expand_stacked(out: torch.Tensor, buffer: torch.Tensor, lora_b_flat_t: torch.Tensor) -> torch.Tensor:
    """`out += buffer @ B_all`, `lora_b_flat_t` `[max_loras * r, out]` (the masked columns add nothing)."""
    return out.addmm_(buffer, lora_b_flat_t)
