"""W8A8: int8 weights per output channel AND int8 activations per token, multiplied by `torch._int_mm`.

Mirrors vLLM's CPU int8 W8A8 path: vllm/model_executor/layers/quantization/compressed_tensors/schemes/
compressed_tensors_w8a8_int8.py (`CompressedTensorsW8A8Int8`: symmetric per-channel int8 weights, dynamic
per-token int8 activations) run by vllm/model_executor/kernels/linear/scaled_mm/cpu.py
(`CPUInt8ScaledMMLinearKernel`: `ops.onednn_scaled_int8_quant` on the input, then oneDNN's int8 GEMM, then the
two scales).

    s_x[m] = max_k |x[m, k]| / 127           one scale per token (row of the batch), computed at every call
    x_q    = round(x / s_x)                  int8
    y      = (x_q @ W_q^T) * s_x[m] * s_w[n]  the product in int32 (exact), scaled once at the end

Why: PyTorch's weight-only kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) are matrix-vector
kernels whose time grows with the number of rows, so at batch 8 they lose to a bfloat16 matmul
(docs/quantization.md). `torch._int_mm` is a real int8 GEMM (VNNI / AMX through oneDNN): the weights are read
once for all the rows of the batch, and the products are int32, like llama.cpp's Q8_0 x Q8_0 dot products.

The cost: activations are rounded too (to 1/254 of each token's largest entry), which weight-only int8 avoids;
`python -m mini bench ppl --schemes ... int8_per_token` measures it. vLLM v0.33.0 has no online name for this
(its W8A8 int8 comes from compressed-tensors checkpoints); `int8_per_token` is mini's name, by analogy with vLLM's
online `fp8_per_token` (weights and per-token activations in fp8). CPU only; the LM head is quantized too, the
embedding keeps its float rows.
"""

from __future__ import annotations

import torch
from torch import nn

from mini.model.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from mini.model.quantization.common import drop_float_weight
from mini.model.quantization.quant_utils import quantize_int8_per_channel


class Int8PerTokenConfig(QuantizationConfig):
    """Online W8A8 int8: every linear layer and the LM head."""

    @classmethod
    def get_name(cls) -> str:
        return "int8_per_token"

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        return Int8PerTokenLinearMethod()


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[M, K]` float -> (int8 `[M, K]`, float32 scales `[M, 1]`), symmetric per row (vLLM's dynamic quant)."""
    x = x.float()
    scales = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-10).div_(127.0)
    return torch.round(x / scales).to(torch.int8), scales


def int8_scaled_mm(x: torch.Tensor, weight_t: torch.Tensor, weight_scales: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """`x [..., K] @ (W_q * s_w)^T` with x quantized per token; `weight_t` int8 `[K, N]`, `weight_scales` `[N]`."""
    flat = x.reshape(-1, x.shape[-1])
    x_q, x_scales = quantize_per_token(flat)
    out = torch._int_mm(x_q, weight_t).float().mul_(x_scales).mul_(weight_scales)
    out = out.to(x.dtype).reshape(*x.shape[:-1], weight_t.shape[1])
    return out if bias is None else out + bias


class Int8PerTokenLinearMethod(QuantizeMethodBase):
    """One layer's int8 weight (stored `[N, K]`, read as its transpose) and per-row float32 scales."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight_int8, scales = quantize_int8_per_channel(layer.weight.data)
        drop_float_weight(layer)
        layer.register_buffer("int8_weight", weight_int8, persistent=False)
        layer.register_buffer("int8_scales", scales.float(), persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return int8_scaled_mm(x, layer.int8_weight.t(), layer.int8_scales, bias)
