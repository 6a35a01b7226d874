"""Quantized weights: the schemes, by vLLM's names (mirrors vllm/model_executor/layers/quantization/__init__.py).

    quantization=                  weights                                  CPU kernel (cpu_kernels.py)
    int8_per_channel_weight_only   int8, a scale per output row (online)    _weight_int8pack_mm, bf16 activations
    gptq                           4-bit, groups of 32..256 inputs          _weight_int4pack_mm_for_cpu, bf16 acts
    gguf                           a GGUF file's Q4_0/Q4_1/Q8_0 blocks      _weight_int4pack_mm_for_cpu (gguf.py)
    int8_per_token                 int8 per channel + int8 activations      torch._int_mm (W8A8, mini's name)

A scheme comes from `LLM(quantization=...)` / `--quantization` or from the checkpoint's `quantization_config`
(`resolve_quant_config`). The model is built on the meta device, then `attach_quant_methods`
(mini/model/loader.py) gives every linear layer (and the LM head where the scheme covers it) its
`quant_method`, checking each layer's shape first, so a shape the packing cannot hold is refused before any
weight is read; after loading, `process_weights_after_loading` (also in the loader) packs the weights for the
kernel. The layers call `quant_method.apply` (mini/model/parallel_linear.py, vocab_parallel_embedding.py).
"""

from __future__ import annotations

from typing import Any

from mini.model.quantization.base_config import QuantizationConfig, QuantizeMethodBase

QUANTIZATION_METHODS: tuple[str, ...] = ("gguf", "gptq", "int8_per_channel_weight_only", "int8_per_token")


def get_quantization_config(quantization: str) -> type[QuantizationConfig]:
    """The config class of a scheme name (imported lazily, as vLLM's)."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} or None, got {quantization!r}")
    from mini.model.quantization.gguf import GGUFConfig
    from mini.model.quantization.gptq import GPTQConfig
    from mini.model.quantization.int8 import Int8PerChannelWeightOnlyConfig
    from mini.model.quantization.int8_per_token import Int8PerTokenConfig

    return {"gguf": GGUFConfig, "gptq": GPTQConfig, "int8_per_channel_weight_only": Int8PerChannelWeightOnlyConfig,
            "int8_per_token": Int8PerTokenConfig}[quantization]


def check_quantization_args(quantization: str | None, device: str, tensor_parallel_size: int) -> None:
    """The engine-argument checks (mini/config.py), before anything loads."""
    if quantization is None:
        return
    config_class = get_quantization_config(quantization)
    device_type = str(device).split(":")[0]
    if device_type not in config_class.supported_devices():
        raise ValueError(f"quantization={quantization!r} runs on {config_class.supported_devices()} in mini, "
                         f"not device={device!r}")
    if tensor_parallel_size != 1:
        raise ValueError(f"quantization={quantization!r} needs tensor_parallel_size=1 in mini (the packed "
                         f"layouts are not sharded), got {tensor_parallel_size}")


def resolve_quant_config(quantization: str | None, hf_config: Any) -> QuantizationConfig | None:
    """The scheme of a checkpoint (its `quantization_config`) or of `quantization=`; they must agree."""
    checkpoint = getattr(hf_config, "quantization_config", None)
    if checkpoint:
        checkpoint = checkpoint if isinstance(checkpoint, dict) else checkpoint.to_dict()
        method = str(checkpoint.get("quant_method", "")).lower()
        if method not in QUANTIZATION_METHODS:
            raise ValueError(f"the checkpoint's quantization_config quant_method must be one of "
                             f"{QUANTIZATION_METHODS} in mini, got {method!r}")
        if quantization is not None and quantization != method:
            raise ValueError(f"quantization={quantization!r} does not match the checkpoint's quant_method "
                             f"{method!r}")
        return get_quantization_config(method).from_config(checkpoint)
    if quantization is None:
        return None
    return get_quantization_config(quantization).from_config({})


__all__ = ["QUANTIZATION_METHODS", "QuantizationConfig", "QuantizeMethodBase", "check_quantization_args",
           "get_quantization_config", "resolve_quant_config"]
