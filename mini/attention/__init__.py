"""Attention backend selection: "torch" (reference) or "triton" (paged kernels).

Mirrors vllm/v1/attention/selector.py (`get_attn_backend`), shrunk to a name -> module table. Both
backends expose the same three names: `AttentionMetadata`, `store_kv(key, value, kv_cache,
slot_mapping)` and `paged_attention(query, kv_cache, metadata, scale)`.

Both backends' `store_kv` / `paged_attention` (and the Triton kernels) are seams (mini/seams.py): the
model calls them by name, so a replacement installed with `mini.seams.override(...)` runs in a live engine.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ATTENTION_BACKEND_MODULES = {
    "torch": "mini.attention.reference",
    "triton": "mini.attention.triton_paged",
}


def get_attention_backend(name: str) -> ModuleType:
    """The module implementing backend `name` ("torch" or "triton"), imported on first use."""
    if name not in ATTENTION_BACKEND_MODULES:
        raise ValueError(f"attention_backend must be one of {tuple(ATTENTION_BACKEND_MODULES)}, got {name!r}")
    return importlib.import_module(ATTENTION_BACKEND_MODULES[name])


__all__ = ["ATTENTION_BACKEND_MODULES", "get_attention_backend"]
