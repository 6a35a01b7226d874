"""The CPU matmuls of the weight-only schemes: PyTorch's packed int8 / int4 kernels, in bfloat16.

Mirrors no single vLLM file: vLLM's CPU backend runs quantized linears through its own C++ kernels (oneDNN,
`vllm/_custom_ops.py`); mini uses the ones PyTorch ships:
- `torch.ops.aten._weight_int8pack_mm(x, w_int8 [N, K], scales [N])`: int8 weights, one scale per output row.
- `torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros [K/g, N, 2])` on a weight
  packed by `_convert_weight_to_int4pack_for_cpu(q [N, K] int32 in 0..15, 1)`; it computes with
  `w = (q - 8) * scale + zero` (so a GPTQ zero point z becomes `zero = (8 - z) * scale`). It needs N to be a
  multiple of 16 and a group size of 32, 64, 128 or 256.
Both read activations in bfloat16 (float32 activations take a slow path: 10-100x slower, measured in
docs/quantization.md), so `apply` casts the input to bfloat16 and the output back to the model's dtype.
"""

from __future__ import annotations

import torch

KERNEL_DTYPE = torch.bfloat16
INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_N_MULTIPLE = 16


def int8_linear(x: torch.Tensor, weight_int8: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ (weight_int8 * scales[:, None]).T + bias`, weight never expanded to floating point."""
    flat = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
    out = torch.ops.aten._weight_int8pack_mm(flat, weight_int8, scales)
    out = out.to(x.dtype).reshape(*x.shape[:-1], weight_int8.shape[0])
    return out if bias is None else out + bias


def pack_int4_for_cpu(q: torch.Tensor, scales: torch.Tensor,
                      offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int32 `[N, K]`, scales `[N, K/g]`, offsets `[N, K/g]`) -> (packed weight, scales_and_zeros), for
    `w = q * scale + offset` (an integer zero point z: offset = -z * scale; a Q4_1 minimum: offset = min)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    s = scales.float()
    offsets = offsets.float() + 8.0 * s   # the kernel computes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([s.t(), offsets.t()], dim=-1).to(KERNEL_DTYPE).contiguous()
    return packed, scales_and_zeros


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + bias` for a 4-bit weight packed by `pack_int4_for_cpu`."""
    flat = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, group_size, scales_and_zeros)
    out = out.to(x.dtype).reshape(*x.shape[:-1], out_features)
    return out if bias is None else out + bias
