"""The two abstractions every quantization scheme implements (mirrors
vllm/model_executor/layers/quantization/base_config.py).

- `QuantizeMethodBase`: HOW one layer stores and multiplies its weight. `create_weights(layer)` registers the
  layer's parameters (for a quantized checkpoint: the packed integers and their scales, each with a
  `weight_loader` that knows the packed layout); `process_weights_after_loading(layer)` turns what was loaded
  into what the kernel reads (a repack, or, for an online scheme, the quantization itself); `apply(layer, x)`
  is the layer's matmul.
- `QuantizationConfig`: WHICH method each layer gets (`get_quant_method(layer, prefix)`), built from a
  checkpoint's `quantization_config` (`from_config`) or from the name given as `quantization=`.

Where mini differs: vLLM hands the config to each layer's constructor; mini builds the model first (on the meta
device, no storage) and then gives each linear layer its method (`mini/model/quantization/__init__.py`
`attach_quant_methods`), so the model file needs no quantization argument. mini has no MoE, KV-cache or
embedding methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


class QuantizeMethodBase(ABC):
    """How one layer holds and applies its (possibly quantized) weight."""

    def create_weights(self, layer: nn.Module) -> None:  # noqa: B027 - optional, as vLLM's default
        """Register the layer's parameters before loading (default: keep the float `weight` it was built with)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for input `x` (`[..., in_features]` -> `[..., out_features]`)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 - optional
        """Turn the loaded tensors into the kernel's layout (default: nothing to do)."""


class QuantizationConfig(ABC):
    """A quantization scheme: its vLLM name, how to read it from a checkpoint, which layers it covers."""

    @classmethod
    @abstractmethod
    def get_name(cls) -> str:
        """The name given as `quantization=` (vLLM's)."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """From a checkpoint's `quantization_config` dict (an online scheme takes `{}`)."""
        return cls()

    @staticmethod
    def get_from_keys(config: dict[str, Any], keys: list[str], default: Any = None) -> Any:
        """The first of `keys` present in `config`, else `default`."""
        for key in keys:
            if key in config:
                return config[key]
        return default

    @classmethod
    def supported_devices(cls) -> tuple[str, ...]:
        """Device types whose kernels this scheme has ("cpu", "cuda")."""
        return ("cpu",)

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method for `layer` (named `prefix` in the model), or None to leave it in floating point."""

    def check_layer(self, layer: nn.Module, prefix: str) -> None:  # noqa: B027 - optional
        """Raise ValueError, naming the layer, when its shape does not fit the scheme (called before loading)."""
