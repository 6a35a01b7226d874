"""Helpers shared by the linear methods: a layer's shape, swapping its float weight for packed tensors.

Mirrors vllm/model_executor/utils.py (`set_weight_attrs`, `replace_parameter`) in spirit: a method
registers its tensors on the layer it serves, and attaches the loader that fills them.
"""

from __future__ import annotations

import torch
from torch import nn


def is_lm_head(layer: nn.Module) -> bool:
    """The LM head is an embedding-shaped layer whose weight may be SHARED with the embedding (tied)."""
    return isinstance(layer, nn.Embedding)


def weight_shape(layer: nn.Module) -> tuple[int, int]:
    """(out_features, in_features) of a linear layer or an LM head."""
    if is_lm_head(layer):
        return int(layer.num_embeddings), int(layer.embedding_dim)
    return int(layer.out_features), int(layer.in_features)


def drop_float_weight(layer: nn.Module) -> None:
    """Free the float weight once a packed copy serves the matmul; a (possibly tied) LM head keeps it."""
    if not is_lm_head(layer) and "weight" in layer._parameters:
        del layer.weight


def exact_loader(name: str):
    """A `weight_loader` for a packed tensor: the checkpoint's tensor must have the parameter's shape."""
    def load(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if tuple(loaded_weight.shape) != tuple(param.shape):
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(loaded_weight.shape)}, the packed "
                             f"layout expects {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(loaded_weight.to(param.dtype))
    return load


def register_packed(layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                    device: torch.device) -> None:
    """Add an empty checkpoint tensor `name` to `layer`, filled at load by an exact-shape loader.

    The loader is kept on the layer (`layer.param_weight_loaders[name]`, read by mini/model/loader.py), not on the
    parameter as vLLM does: `Module.to_empty` makes new parameter objects, which would drop the attribute."""
    layer.register_parameter(name, nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False))
    if "param_weight_loaders" not in layer.__dict__:
        layer.param_weight_loaders = {}
    layer.param_weight_loaders[name] = exact_loader(name)
