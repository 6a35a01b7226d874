"""A linear layer with LoRA: the base projection, plus `scaling * B(A x)` of each token's adapter.

Mirrors vllm/lora/layers/base_linear.py (`BaseLinearLayerWithLoRA`: the base layer's output, then the punica
wrapper adds the adapters' part) and its column/row-parallel subclasses (vllm/lora/layers/
column_parallel_linear.py, row_parallel_linear.py), collapsed into one class: mini serves LoRA without tensor
parallelism, so a layer's A and B are whole. The weights of every GPU slot are stacked, zero-padded to
`max_lora_rank`: `lora_a` `[max_loras, max_lora_rank, in]`, `lora_b` `[max_loras, out, max_lora_rank]`, the
adapter's scaling already folded into B. A slot the adapter does not target stays zero, adding nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from mini.lora.punica_wrapper import PunicaWrapper


class SharedShrink:
    """The A of projections that read the same input (q/k/v; gate/up), side by side: in a stacked step the first
    of them shrinks the input through all of them in one matmul, the others reuse that result (mini's; vLLM
    fuses them into one layer, `MergedQKVParallelLinearWithLoRA` in vllm/lora/layers/column_parallel_linear.py)."""

    def __init__(self, num_members: int, max_loras: int, max_lora_rank: int, in_features: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.num_members = num_members
        self.lora_a = torch.zeros(num_members, max_loras, max_lora_rank, in_features, device=device, dtype=dtype)
        self._input: torch.Tensor | None = None     # the input last shrunk (held, so `is` cannot mistake another)
        self._buffer: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None

    def shrink(self, punica: PunicaWrapper, x: torch.Tensor) -> torch.Tensor:
        """`[T, num_members * max_loras * r]`: every member's masked shrink of `x`, computed once per input."""
        if self._input is not x or self._mask is not punica.mask:   # a new input, or a new step's mapping
            self._buffer = punica.shrink_stacked(x, self.lora_a.view(-1, self.lora_a.shape[-1]), self.num_members)
            self._input, self._mask = x, punica.mask
        return self._buffer


class LinearWithLoRA(nn.Module):
    """Wraps `base_layer` (a mini linear layer, any kind); `forward(x) = base_layer(x) + LoRA(x)`."""

    def __init__(self, base_layer: nn.Module, in_features: int, out_features: int, max_loras: int,
                 max_lora_rank: int, punica: PunicaWrapper, device: torch.device, dtype: torch.dtype,
                 shared: SharedShrink | None = None, member: int = 0) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = in_features, out_features
        self.punica = punica
        # Plain attributes, not buffers: they are not checkpoint weights (vLLM: `lora_a_stacked`, `lora_b_stacked`).
        # With `shared`, this layer's A is its slice of the shared one (written in place by `set_lora`).
        self.shared, self.member = shared, member
        self.lora_a_stacked = (torch.zeros(max_loras, max_lora_rank, in_features, device=device, dtype=dtype)
                               if shared is None else shared.lora_a[member])
        self.lora_b_stacked = torch.zeros(max_loras, out_features, max_lora_rank, device=device, dtype=dtype)
        # Every slot's B as one `[max_loras * r, out]` matrix, for the torch ops' one-matmul expand (kept in step).
        self.lora_b_flat_t = torch.zeros(max_loras * max_lora_rank, out_features, device=device, dtype=dtype)

    def set_lora(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        """Copy one adapter's A `[r, in]` and scaled B `[out, r]` into `slot` (vLLM: `set_lora`)."""
        self.reset_lora(slot)
        rank = lora_a.shape[0]
        self.lora_a_stacked[slot, :rank].copy_(lora_a)
        self.lora_b_stacked[slot, :, :rank].copy_(lora_b)
        self._sync_flat(slot)

    def reset_lora(self, slot: int) -> None:
        self.lora_a_stacked[slot].zero_()
        self.lora_b_stacked[slot].zero_()
        self._sync_flat(slot)

    def _sync_flat(self, slot: int) -> None:
        rank = self.lora_b_stacked.shape[2]
        self.lora_b_flat_t[slot * rank:(slot + 1) * rank].copy_(self.lora_b_stacked[slot].T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        if not self.punica.active:
            return out
        if self.shared is not None and self.punica.mask is not None:   # stacked step: the shared shrink
            width = self.lora_b_flat_t.shape[0]
            buffer = self.shared.shrink(self.punica, x)[:, self.member * width:(self.member + 1) * width]
            out.addmm_(buffer, self.lora_b_flat_t)
            return out
        self.punica.add_lora(out, x, self.lora_a_stacked, self.lora_b_stacked, self.lora_b_flat_t)
        return out
