"""The step's token -> adapter-slot mapping, shared by every LoRA layer, and the op that applies it.

Mirrors vllm/lora/punica_wrapper/punica_base.py (`PunicaWrapperBase.update_metadata`: the mapping is set
once per step, before the forward, and every wrapped layer reads it) with the two back ends of
vllm/lora/punica_wrapper/punica_cpu.py (torch ops) and punica_gpu.py (Triton kernels). Slot -1: no adapter.
A step with no adapter at all sets no mapping, and the layers then run the base projection alone.
"""

from __future__ import annotations

import torch

from mini.lora.ops import torch_ops

# The torch back end's two ways (mini/lora/ops/torch_ops.py): a step of at most this many tokens (decode-sized,
# where the cost is the number of ops) runs the stacked ops, three ops per layer; a bigger one (a prefill, where
# the cost is the FLOPs) runs one matmul pair per adapter on its own tokens only.
GROUPED_MIN_TOKENS = 128


class PunicaWrapper:
    """`set_mapping(token_slots)` once per step; `add_lora(out, x, lora_a, lora_b)` in every LoRA layer."""

    def __init__(self, backend: str = "torch", max_loras: int = 1, max_lora_rank: int = 1) -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"LoRA backend must be 'torch' or 'triton', got {backend!r}")
        self.backend = backend
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.token_slots: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None   # torch back end: `torch_ops.slot_mask`, built once per step
        self.groups: list[tuple[int, torch.Tensor | None]] = []   # ... or the tokens of each slot (big steps)
        self._masks: dict[int, torch.Tensor] = {}   # the mask repeated for projections sharing a shrink

    def set_mapping(self, token_slots: torch.Tensor | None) -> None:
        """This step's slot of every token (int `[T]`), or None when no token uses an adapter."""
        if token_slots is not None and not bool((token_slots >= 0).any()):
            token_slots = None
        self.token_slots = token_slots
        self.mask, self.groups = None, []
        self._masks: dict[int, torch.Tensor] = {}
        if token_slots is not None and self.backend == "torch":
            if token_slots.shape[0] > GROUPED_MIN_TOKENS:
                self.groups = torch_ops.group_tokens(token_slots)
            else:
                self.mask = torch_ops.slot_mask(token_slots, self.max_loras, self.max_lora_rank, torch.float32)

    def shrink_stacked(self, x: torch.Tensor, lora_a_flat: torch.Tensor, num_members: int = 1) -> torch.Tensor:
        """`(x @ lora_a_flat.T) * mask` for `num_members` projections' A side by side (a stacked step only)."""
        mask = self._masks.get(num_members)
        if mask is None or mask.dtype != x.dtype:
            mask = self._masks[num_members] = self.mask.to(x.dtype).repeat(1, num_members)
        return torch_ops.lora_shrink_stacked(x, lora_a_flat, mask)

    @property
    def active(self) -> bool:
        return self.token_slots is not None

    def add_lora(self, out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 lora_b_flat_t: torch.Tensor | None = None) -> None:
        """`out[t] += B[s] @ (A[s] @ x[t])` for every token t of adapter slot s (in place). `lora_b_flat_t`:
        B of every slot as one `[max_loras * r, out]` matrix (the layer keeps it; made here when not given)."""
        if self.token_slots is None:
            return
        if x.shape[0] != self.token_slots.shape[0]:
            raise ValueError(f"the LoRA mapping covers {self.token_slots.shape[0]} tokens, the layer got "
                             f"{x.shape[0]}")
        if self.backend == "triton":
            from mini.lora.ops import triton_ops
            triton_ops.add_lora(out, x, lora_a, lora_b, self.token_slots)
            return
        if self.groups:
            torch_ops.lora_expand(out, torch_ops.lora_shrink(x, lora_a, self.groups), lora_b, self.groups)
            return
        if lora_b_flat_t is None:
            lora_b_flat_t = lora_b.permute(0, 2, 1).reshape(-1, lora_b.shape[1])
        mask = self.mask if self.mask.dtype == x.dtype else self.mask.to(x.dtype)
        buffer = torch_ops.lora_shrink_stacked(x, lora_a.view(-1, lora_a.shape[-1]), mask)
        torch_ops.lora_expand_stacked(out, buffer, lora_b_flat_t)
