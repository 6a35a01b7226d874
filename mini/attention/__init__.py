"""Attention backend selection: "torch" (reference), "torch_fast" (CPU default) or "triton" (paged kernels).

Mirrors vllm/v1/attention/selector.py (`get_attn_backend`), shrunk to a name -> module table. Every
backend exposes the same three names: `AttentionMetadata`, `store_kv(key, value, kv_cache,
slot_mapping)` and `paged_attention(query, kv_cache, metadata, scale)`.

- "torch": mini/attention/reference.py, the readable PyTorch version phase 03 teaches.
- "torch_fast": mini/attention/cpu_paged.py, the same results cut into fewer, larger tensor ops: the default
  on CPU (`LLM()` on a CPU uses it; `LLM(attention_backend="torch")` picks the reference).
- "triton": mini/attention/triton_paged.py, the kernels of phase 07 (the default on CUDA).

The reference and Triton `store_kv` / `paged_attention` (and the Triton kernels) are seams (mini/seams.py):
the model calls them by name, so a replacement installed with `mini.seams.override(...)` runs in a live
engine; "torch_fast" hands over to the reference functions while one of them is replaced.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ATTENTION_BACKEND_MODULES = {
    "torch": "mini.attention.reference",
    "torch_fast": "mini.attention.cpu_paged",
    "triton": "mini.attention.triton_paged",
}


def get_attention_backend(name: str) -> ModuleType:
    """The module implementing backend `name` ("torch", "torch_fast" or "triton"), imported on first use."""
    if name not in ATTENTION_BACKEND_MODULES:
        raise ValueError(f"attention_backend must be one of {tuple(ATTENTION_BACKEND_MODULES)}, got {name!r}")
    return importlib.import_module(ATTENTION_BACKEND_MODULES[name])


__all__ = ["ATTENTION_BACKEND_MODULES", "get_attention_backend"]
