"""Attention backend selection: "torch" (reference), "torch_fast" (CPU default) or "triton" (paged kernels).

Mirrors vllm/v1/attention/selector.py (`get_attn_backend`: a backend CLASS chosen once, when the model is
built), shrunk to a name -> class table. Every backend instance has the same two methods,
`store_kv(key, value, kv_cache, slot_mapping)` and `paged_attention(query, kv_cache, metadata, scale)`,
and reads the one `AttentionMetadata` of mini/attention/metadata.py.

- "torch": `ReferenceAttentionBackend` (mini/attention/reference.py), the readable PyTorch version phase 03
  teaches; `LLM(attention_backend="torch")` picks it.
- "torch_fast": `CpuAttentionBackend` (mini/attention/cpu_paged.py), the same results cut into fewer, larger
  tensor ops: the default on CPU.
- "triton": `TritonAttentionBackend` (mini/attention/triton_paged.py), the kernels of phase 07 (the default
  on CUDA).

The engine builds its backend once (`build_attention_backend(name, config)`) and every layer holds that
instance. The reference and Triton backends are homes of the `attention` role (mini/roles.py): an engine
built with some of their parts replaced builds a subclass holding them; one that asks for "torch_fast"
while a part of the reference is replaced builds the reference backend instead.
"""

from __future__ import annotations

import importlib
from typing import Any

from mini import roles
from mini.attention.metadata import AttentionMetadata, build_attention_metadata

ATTENTION_BACKEND_CLASSES = {
    "torch": "mini.attention.reference:ReferenceAttentionBackend",
    "torch_fast": "mini.attention.cpu_paged:CpuAttentionBackend",
    "triton": "mini.attention.triton_paged:TritonAttentionBackend",  # imports Triton: only when chosen
}
ATTENTION_BACKEND_MODULES = {name: path.split(":")[0] for name, path in ATTENTION_BACKEND_CLASSES.items()}


def attention_backend_class(name: str, config: Any = None) -> type:
    """The class the engine configured by `config` builds for backend `name` (as vLLM's attention selector,
    vllm/v1/attention/selector.py, picks a backend class once): the backend itself, or, when `config.parts`
    replaces some of its parts, the role's reference class holding them (mini/roles.py). Its module is
    imported on first use."""
    if name not in ATTENTION_BACKEND_CLASSES:
        raise ValueError(f"attention_backend must be one of {tuple(ATTENTION_BACKEND_CLASSES)}, got {name!r}")
    module_name, class_name = ATTENTION_BACKEND_CLASSES[name].split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return roles.resolve(config, backend_class)


def build_attention_backend(backend: str | Any, config: Any = None) -> Any:
    """A backend instance from its name (an instance is returned as it is: layers may share one)."""
    if not isinstance(backend, str):
        return backend
    return attention_backend_class(backend, config)()


__all__ = ["ATTENTION_BACKEND_CLASSES", "ATTENTION_BACKEND_MODULES", "AttentionMetadata", "attention_backend_class",
           "build_attention_backend", "build_attention_metadata"]
