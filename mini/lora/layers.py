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


class LinearWithLoRA(nn.Module):
    """Wraps `base_layer` (a mini linear layer, any kind); `forward(x) = base_layer(x) + LoRA(x)`."""

    def __init__(self, base_layer: nn.Module, in_features: int, out_features: int, max_loras: int,
                 max_lora_rank: int, punica: PunicaWrapper, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = in_features, out_features
        self.punica = punica
        # Plain attributes, not buffers: they are not checkpoint weights (vLLM: `lora_a_stacked`, `lora_b_stacked`).
        self.lora_a_stacked = torch.zeros(max_loras, max_lora_rank, in_features, device=device, dtype=dtype)
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
        if self.punica.active:
            self.punica.add_lora(out, x, self.lora_a_stacked, self.lora_b_stacked, self.lora_b_flat_t)
        return out
