"""The step's token -> adapter-slot mapping, shared by every LoRA layer, and the op that applies it.

Mirrors vllm/lora/punica_wrapper/punica_base.py (`PunicaWrapperBase.update_metadata`: the mapping is set
once per step, before the forward, and every wrapped layer reads it) with the two back ends of
vllm/lora/punica_wrapper/punica_cpu.py (torch ops) and punica_gpu.py (Triton kernels). Slot -1: no adapter.
A step with no adapter at all sets no mapping, and the layers then run the base projection alone.

Three parts of the `model` role (mini/roles.py) live here: `compute_token_lora_indices` (each request's adapter
and scheduled token count -> each token's slot; vLLM: `convert_mapping` in vllm/lora/punica_wrapper/utils.py over
the per-token ids the model runner repeats, vllm/v1/worker/gpu_input_batch.py `make_lora_inputs`), `lora_shrink`
and `lora_expand` (the per-token ops, vLLM's `bgmv_shrink` / `bgmv_expand_slice`). The fast wrapper runs stacked or
grouped ops instead of the last two, so an engine that replaces one builds `ReferencePunicaWrapper`, which calls
them for every layer.
"""

from __future__ import annotations

import torch

from mini.lora.ops import torch_ops

# The torch back end's two ways (mini/lora/ops/torch_ops.py): a step of at most this many tokens (decode-sized,
# where the cost is the number of ops) runs the stacked ops, three ops per layer; a bigger one (a prefill, where
# the cost is the FLOPs) runs one matmul pair per adapter on its own tokens only.
GROUPED_MIN_TOKENS = 128


def compute_token_lora_indices(req_lora_ids: torch.Tensor, num_scheduled_tokens: torch.Tensor,
                               lora_index_to_id: list[int | None]) -> torch.Tensor:
    """int64 `[sum(num_scheduled_tokens)]`: every token of the step, in batch order, gets the slot (the index in
    `lora_index_to_id`) holding its request's adapter, or -1 when the request runs the base model (id 0)."""
    slot_of_id = torch.full((max([0, *(i for i in lora_index_to_id if i is not None)]) + 1,), -1, dtype=torch.int64)
    for slot, lora_id in enumerate(lora_index_to_id):
        if lora_id is not None:
            slot_of_id[lora_id] = slot
    slot_of_id[0] = -1   # id 0: no adapter
    req_slots = slot_of_id[req_lora_ids.to(torch.int64)]
    return torch.repeat_interleave(req_slots, num_scheduled_tokens.to(torch.int64))


class PunicaWrapper:
    """`update_metadata(...)` (or `set_mapping(token_slots)`) once per step; `add_lora(out, x, lora_a, lora_b)` in
    every LoRA layer."""

    # parts of the `model` role (mini/roles.py)
    compute_token_lora_indices = staticmethod(compute_token_lora_indices)
    lora_shrink = staticmethod(torch_ops.lora_shrink)
    lora_expand = staticmethod(torch_ops.lora_expand)

    def __init__(self, backend: str = "torch", max_loras: int = 1, max_lora_rank: int = 1) -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"LoRA backend must be 'torch' or 'triton', got {backend!r}")
        self.backend = backend
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.token_slots: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None   # torch back end: `torch_ops.slot_mask`, built once per step
        self.groups: list[tuple[int, torch.Tensor | None]] = []   # ... or the tokens of each slot (big steps)
        self._masks: dict[int, torch.Tensor] = {}   # the mask repeated for projections sharing a shrink

    def update_metadata(self, req_lora_ids: torch.Tensor, num_scheduled_tokens: torch.Tensor,
                        lora_index_to_id: list[int | None], device: torch.device | str = "cpu") -> None:
        """This step's mapping from each request's adapter id (0: none) and token count, and the slot table
        (vLLM: `PunicaWrapperBase.update_metadata`)."""
        token_slots = self.compute_token_lora_indices(req_lora_ids, num_scheduled_tokens, lora_index_to_id)
        self.set_mapping(token_slots.to(device))

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
            torch_ops.lora_expand_grouped(out, torch_ops.lora_shrink_grouped(x, lora_a, self.groups), lora_b,
                                          self.groups)
            return
        if lora_b_flat_t is None:
            lora_b_flat_t = lora_b.permute(0, 2, 1).reshape(-1, lora_b.shape[1])
        mask = self.mask if self.mask.dtype == x.dtype else self.mask.to(x.dtype)
        buffer = torch_ops.lora_shrink_stacked(x, lora_a.view(-1, lora_a.shape[-1]), mask)
        torch_ops.lora_expand_stacked(out, buffer, lora_b_flat_t)


class ReferencePunicaWrapper(PunicaWrapper):
    """The readable wrapper: no stacked mask, no grouping, no kernel; every LoRA layer's `add_lora` calls the parts
    `lora_shrink` then `lora_expand` (scaling 1: mini folds each adapter's scaling into its B at load)."""

    def set_mapping(self, token_slots: torch.Tensor | None) -> None:
        if token_slots is not None and not bool((token_slots >= 0).any()):
            token_slots = None
        self.token_slots = token_slots
        self.mask, self.groups, self._masks = None, [], {}

    def add_lora(self, out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 lora_b_flat_t: torch.Tensor | None = None) -> None:
        if self.token_slots is None:
            return
        if x.shape[0] != self.token_slots.shape[0]:
            raise ValueError(f"the LoRA mapping covers {self.token_slots.shape[0]} tokens, the layer got "
                             f"{x.shape[0]}")
        buffer = self.lora_shrink(x, lora_a, self.token_slots, 1.0)
        self.lora_expand(out, buffer, lora_b, self.token_slots, 0)
