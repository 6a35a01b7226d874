"""`quantization="gguf"`: a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks served as stored, without a float copy.

vLLM's design (its GGUF method lived in vllm/model_executor/layers/quantization/ up to the releases before v0.33.0,
which dropped it; the abstractions it implemented are those of vllm/model_executor/layers/quantization/base_config.py):
`GGUFConfig` knows each tensor's GGUF type, `GGUFLinearMethod.create_weights` gives a layer a `qweight` of raw
block bytes (vLLM: `qweight` plus `qweight_type`), and `apply` multiplies with a kernel chosen by that type.

mini's kernel is PyTorch's CPU int4 one (cpu_kernels.py), fed the blocks' own integers and scales
(gguf_blocks.py): Q4_0 and Q4_1 map onto it exactly (groups of 32, scale d, zero point from the block); Q8_0 runs
as two 4-bit planes of the same blocks. With float32 activations the scale table is float32, and the weights the
kernel multiplies are the `gguf` package's dequantized values bit for bit. With bfloat16 activations the kernel
wants its table in bfloat16, so d (a float16) loses 3 bits there, the same order as the activations' own
rounding. float32 is the exact mode and a slow one (PyTorch's float32 int4 path); bfloat16 is the serving mode.
The table is built once, in the model's dtype (`params_dtype`, as vLLM's `create_weights` receives it).

Which file: the model folder's `*.gguf`, or the GGUF a packaged model was converted from
(mini/model/gguf_loader.py `gguf_source`); the config (`config.json`) and tokenizer come from the folder as usual.
A type mini has no kernel for (Q4_K, Q6_K, ...) or a tensor whose shape differs from the layer's is refused in
`check_layer`, before any weight is read. Float tensors (F32/F16/BF16) stay unquantized layers. The embedding
keeps float rows for its lookups (the tied LM head multiplies the blocks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mini.model.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from mini.model.quantization.common import is_lm_head, register_packed, weight_shape
from mini.model.quantization.cpu_kernels import INT4_N_MULTIPLE, KERNEL_DTYPE
from mini.model.quantization.gguf_blocks import BLOCK_SIZE, QUANTIZED_TYPES, decode_blocks, row_bytes

FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = QUANTIZED_TYPES + FLOAT_TYPES


class GGUFConfig(QuantizationConfig):
    """The GGUF types of one file's tensors (`tensor_types`: mini's name -> (type, shape `[out, in]`))."""

    def __init__(self, gguf_path: str | Path, tensor_types: dict[str, tuple[str, tuple[int, ...]]],
                 tie_word_embeddings: bool = False, params_dtype: torch.dtype = torch.bfloat16) -> None:
        self.gguf_path = Path(gguf_path)
        self.tensor_types = dict(tensor_types)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        # the model's dtype (vLLM passes it to create_weights): float32 -> the exact float32 kernel, else bfloat16
        self.kernel_dtype = torch.float32 if params_dtype == torch.float32 else KERNEL_DTYPE

    @classmethod
    def get_name(cls) -> str:
        return "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GGUFConfig:
        raise ValueError("quantization='gguf' reads its blocks from a .gguf model: pass a .gguf file, a folder "
                         "holding one, or a packaged GGUF model (HuggingFaceTB/SmolLM2-135M-Instruct) as model=")

    @classmethod
    def from_reader(cls, gguf_path: str | Path, reader: Any, hf_config: Any,
                    params_dtype: torch.dtype = torch.bfloat16) -> GGUFConfig:
        from mini.model.gguf_weights import tensor_infos

        types = {name: (info.type_name, info.shape) for name, info in tensor_infos(reader).items()}
        return cls(gguf_path, types, bool(getattr(hf_config, "tie_word_embeddings", False)), params_dtype)

    def tensor_name(self, prefix: str) -> str:
        """The file's tensor behind layer `prefix` (a tied LM head: the embedding)."""
        name = f"{prefix}.weight"
        if prefix == "lm_head" and name not in self.tensor_types and self.tie_word_embeddings:
            return "model.embed_tokens.weight"
        return name

    def type_of(self, prefix: str) -> str | None:
        entry = self.tensor_types.get(self.tensor_name(prefix))
        return None if entry is None else entry[0]

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        type_name = self.type_of(prefix)
        if type_name is None or type_name in FLOAT_TYPES:
            return None   # float in the file: an unquantized layer (a missing tensor is reported by the loader)
        return GGUFLinearMethod(self, type_name)

    def check_layer(self, layer: nn.Module, prefix: str) -> None:
        name = self.tensor_name(prefix)
        type_name, shape = self.tensor_types[name]
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(f"GGUF tensor {name} is {type_name}; mini's gguf kernels serve {SUPPORTED_TYPES}")
        expected = weight_shape(layer)
        if tuple(shape) != expected:
            raise ValueError(f"GGUF tensor {name} has shape {tuple(shape)}, the layer {prefix} expects {expected}")
        if expected[1] % BLOCK_SIZE or expected[0] % INT4_N_MULTIPLE:
            raise ValueError(f"GGUF tensor {name} of shape {expected}: the int4 kernel needs in_features divisible "
                             f"by {BLOCK_SIZE} and out_features by {INT4_N_MULTIPLE}")


class GGUFLinearMethod(QuantizeMethodBase):
    """One layer's blocks: raw bytes at load, one or two int4 planes (packed weight + scale table) to multiply."""

    def __init__(self, config: GGUFConfig, type_name: str) -> None:
        self.config, self.type_name = config, type_name

    def create_weights(self, layer: nn.Module) -> None:
        out_features, in_features = weight_shape(layer)
        device = layer.weight.device
        if not (is_lm_head(layer) and self.config.tie_word_embeddings):
            del layer.weight   # never allocated: the blocks are all this layer holds
        register_packed(layer, "qweight", (out_features, row_bytes(self.type_name, in_features)), torch.uint8, device)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        planes = decode_blocks(layer.qweight.data, self.type_name)
        del layer.qweight
        layer.gguf_planes = [pack_plane(q, scales, offsets, self.config.kernel_dtype) for q, scales, offsets in planes]
        layer.quant_out_features = planes[0][0].shape[0]

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(self.config.kernel_dtype)
        out = None
        for packed, table in layer.gguf_planes:
            part = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, BLOCK_SIZE, table)
            out = part if out is None else out + part
        out = out.to(x.dtype).reshape(*x.shape[:-1], layer.quant_out_features)
        return out if bias is None else out + bias


def pack_plane(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
               dtype: torch.dtype = KERNEL_DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int32 `[N, K]`, scales, offsets `[N, K/32]`, `w = q * scale + offset`) -> (packed weight, scale table in
    `dtype`, the activations' dtype): the kernel computes `(q - 8) * scale + zero`, so `zero = offset + 8 * scale`
    (computed in float32, where it is exact). In bfloat16: half a byte per weight and 4 bytes per 32, Q4_1's size."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    table = torch.stack([scales.t(), (offsets + 8.0 * scales).t()], dim=-1).float()
    return packed, table.to(dtype).contiguous()
