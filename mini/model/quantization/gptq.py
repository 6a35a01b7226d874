"""4-bit weights in groups, GPTQ's checkpoint layout (mirrors vllm/model_executor/layers/quantization/auto_gptq.py).

`GPTQConfig` reads a checkpoint's `quantization_config` (`{"quant_method": "gptq", "bits": 4, "group_size": 128,
"desc_act": false, "sym": true, "lm_head": false}`). For such a checkpoint `GPTQLinearMethod.create_weights`
swaps each linear layer's float `weight` for `qweight`, `qzeros`, `scales` and `g_idx` (layout in
quant_utils.py), each loaded by an exact-shape `weight_loader`; `process_weights_after_loading` unpacks them and
repacks into PyTorch's CPU int4 layout (cpu_kernels.py); `apply` is `_weight_int4pack_mm_for_cpu`.

Where mini differs: vLLM serves GPTQ only from a GPTQ checkpoint. mini also accepts `quantization="gptq"` on a
float checkpoint: the float weights are loaded, then rounded to nearest into 4-bit groups of 32 with a float
minimum, as llama.cpp's Q4_1 blocks (`quantize_int4_groups_min`; exact on weights that came from Q4_1). The LM
head gets an 8-bit copy instead (vLLM: online/lm_head.py; W8A8, int8_per_token.py), as llama.cpp keeps its output
matrix at 6-8 bits and SmolLM2's GGUF ships it as Q8_0: on SmolLM2 a 4-bit head cost 6.9 % of perplexity, an
8-bit one 0.8 % in all (docs/quantization.md), and the W8A8 head is also the faster one at batch 8. This is
what `python -m mini bench ppl` and the llama.cpp comparison measure. No act-order (`desc_act`), 4 bits only,
CPU only (`python -m mini bench gpu` runs the Triton dequant-matmul of triton_int4.py on CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mini.model.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from mini.model.quantization.common import drop_float_weight, is_lm_head, register_packed, weight_shape
from mini.model.quantization.cpu_kernels import INT4_GROUP_SIZES, INT4_N_MULTIPLE, int4_linear, pack_int4_for_cpu
from mini.model.quantization.int8_per_token import Int8PerTokenLinearMethod
from mini.model.quantization.quant_utils import PACK_FACTOR, quantize_int4_groups_min, unpack_gptq, unpack_int4_rows

ONLINE_GROUP_SIZE = 32


class GPTQConfig(QuantizationConfig):
    """4-bit weights, `group_size` inputs per scale and zero point."""

    def __init__(self, weight_bits: int = 4, group_size: int = ONLINE_GROUP_SIZE, desc_act: bool = False,
                 lm_head_quantized: bool = True, from_checkpoint: bool = False) -> None:
        if weight_bits != 4:
            raise ValueError(f"quantization_config bits must be 4 for gptq in mini, got {weight_bits!r}")
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"quantization_config group_size must be one of {INT4_GROUP_SIZES} for gptq on the "
                             f"CPU kernel, got {group_size!r}")
        if desc_act:
            raise ValueError("quantization_config desc_act must be false: mini has no act-order GPTQ kernel")
        self.weight_bits, self.group_size, self.desc_act = weight_bits, int(group_size), bool(desc_act)
        self.lm_head_quantized = bool(lm_head_quantized)
        self.from_checkpoint = bool(from_checkpoint)

    @classmethod
    def get_name(cls) -> str:
        return "gptq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTQConfig:
        if not config:   # quantization="gptq" on a float checkpoint: round to nearest at load
            return cls()
        return cls(weight_bits=int(cls.get_from_keys(config, ["bits", "w_bit"], 4)),
                   group_size=int(cls.get_from_keys(config, ["group_size", "q_group_size"], 128)),
                   desc_act=bool(cls.get_from_keys(config, ["desc_act"], False)),
                   lm_head_quantized=bool(cls.get_from_keys(config, ["lm_head"], False)),
                   from_checkpoint=True)

    def check_layer(self, layer: nn.Module, prefix: str) -> None:
        if is_lm_head(layer) and not self.from_checkpoint:
            return   # online: the head is int8 (Int8PerTokenLinearMethod), no 4-bit tile to fit
        out_features, in_features = weight_shape(layer)
        if in_features % self.group_size:
            raise ValueError(f"gptq group_size={self.group_size} does not divide {prefix}'s in_features "
                             f"({in_features}); pick a group size among {INT4_GROUP_SIZES} that does")
        if out_features % INT4_N_MULTIPLE or (self.from_checkpoint and out_features % PACK_FACTOR):
            raise ValueError(f"gptq needs out_features divisible by {INT4_N_MULTIPLE} (the CPU int4 kernel); "
                             f"{prefix} has {out_features}")

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if is_lm_head(layer) and not self.from_checkpoint:
            return Int8PerTokenLinearMethod()   # online: an 8-bit head (module docstring)
        if is_lm_head(layer) and not self.lm_head_quantized:
            return None
        return GPTQLinearMethod(self)


class GPTQLinearMethod(QuantizeMethodBase):
    """One layer's 4-bit weight: GPTQ tensors at load, PyTorch's packed int4 layout for the matmul."""

    # a part of the `model` role (mini/roles.py): how a checkpoint's packed int32 words are read back
    unpack_int4_rows = staticmethod(unpack_int4_rows)

    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module) -> None:
        if not self.config.from_checkpoint:
            return   # online: the float weight is loaded as usual, then quantized
        out_features, in_features = weight_shape(layer)
        device, group = layer.weight.device, self.config.group_size
        del layer.weight
        register_packed(layer, "qweight", (in_features // PACK_FACTOR, out_features), torch.int32, device)
        register_packed(layer, "qzeros", (in_features // group, out_features // PACK_FACTOR), torch.int32, device)
        register_packed(layer, "scales", (in_features // group, out_features), torch.float16, device)
        register_packed(layer, "g_idx", (in_features,), torch.int32, device)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        group = self.config.group_size
        if self.config.from_checkpoint:
            expected = torch.arange(layer.g_idx.numel(), dtype=torch.int32, device=layer.g_idx.device) // group
            if not torch.equal(layer.g_idx.to(torch.int32), expected):
                raise ValueError("gptq g_idx is not input // group_size (an act-order checkpoint): not supported")
            q, scales, zeros = unpack_gptq(layer.qweight.data, layer.qzeros.data, layer.scales.data, group,
                                           unpack_int4_rows=self.unpack_int4_rows)
            offsets = -zeros.float() * scales
            for name in ("qweight", "qzeros", "scales", "g_idx"):
                delattr(layer, name)
        else:
            q, scales, offsets = quantize_int4_groups_min(layer.weight.data, group)
            drop_float_weight(layer)
        packed, scales_and_zeros = pack_int4_for_cpu(q, scales, offsets)
        layer.register_buffer("int4_weight", packed, persistent=False)
        layer.register_buffer("int4_scales_and_zeros", scales_and_zeros, persistent=False)
        layer.quant_out_features = q.shape[0]

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return int4_linear(x, layer.int4_weight, layer.int4_scales_and_zeros, self.config.group_size,
                           layer.quant_out_features, bias)
