"""int8 weights, one scale per output channel, quantized at load (mirrors
vllm/model_executor/layers/quantization/online/int8.py: vLLM's `int8_per_channel_weight_only` online scheme).

The checkpoint is a float one: each linear layer loads its float weight as usual, then
`process_weights_after_loading` rounds every row to int8 with the scale `max|row| / 127` and drops the float copy;
the LM head gets an int8 copy too (vLLM: online/lm_head.py), the embedding keeps its float rows for lookups.
`apply` is PyTorch's `_weight_int8pack_mm` (cpu_kernels.py): activations in bfloat16, weights read as int8.
CPU only in mini.
"""

from __future__ import annotations

import torch
from torch import nn

from mini.model.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from mini.model.quantization.common import drop_float_weight
from mini.model.quantization.cpu_kernels import KERNEL_DTYPE, int8_linear
from mini.model.quantization.quant_utils import quantize_int8_per_channel


class Int8PerChannelWeightOnlyConfig(QuantizationConfig):
    """Online int8, per output channel, symmetric; every linear layer and the LM head."""

    @classmethod
    def get_name(cls) -> str:
        return "int8_per_channel_weight_only"

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        return Int8LinearMethod()


class Int8LinearMethod(QuantizeMethodBase):
    """One layer's int8 weight and its per-row scales."""

    # a part of the `model` role (mini/roles.py): replaceable by the course's phase 15
    quantize_int8_per_channel = staticmethod(quantize_int8_per_channel)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight_int8, scales = self.quantize_int8_per_channel(layer.weight.data)
        drop_float_weight(layer)
        layer.register_buffer("int8_weight", weight_int8, persistent=False)
        layer.register_buffer("int8_scales", scales.to(KERNEL_DTYPE), persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return int8_linear(x, layer.int8_weight, layer.int8_scales, bias)
