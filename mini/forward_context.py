"""The step's attention context, set around a forward pass and read by the attention op inside it.

Mirrors vllm/forward_context.py (`ForwardContext`, `set_forward_context`, `get_forward_context`). Eager
mini passes the attention metadata and each layer's KV cache down the model as arguments. A compiled
forward cannot: torch.compile traces the model once, and a graph input that changes shape every step (the
metadata's block table, its plan) would either be baked into the graph or guarded on and recompiled. So,
as vLLM does, the runner-side wrapper (mini/compilation.py) sets this context for the duration of one
forward, and the opaque attention op (mini/attention/unified_attention.py) reads the step's metadata and
its layer's cache from here. The graph sees only the query/key/value tensors going in and the output
coming out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from mini.attention.metadata import AttentionMetadata


@dataclass(frozen=True, slots=True)
class ForwardContext:
    """What the attention op of layer i needs during one forward (vLLM: `ForwardContext.attn_metadata` and
    `no_compile_layers`, the attention layers by name)."""

    attn_metadata: AttentionMetadata
    kv_caches: Sequence[torch.Tensor]   # one per layer, in layer order
    attention_layers: Sequence[Any]     # the model's attention modules, in layer order: each holds its backend


# Per thread: an AsyncLLM engine loop (or an async-scheduling step) runs the forward on its own thread.
_local = threading.local()


@contextmanager
def set_forward_context(attn_metadata: AttentionMetadata, kv_caches: Sequence[torch.Tensor],
                        attention_layers: Sequence[Any]) -> Iterator[ForwardContext]:
    """Make the step's metadata and caches visible to the attention op until the block ends."""
    previous = getattr(_local, "context", None)
    _local.context = context = ForwardContext(attn_metadata, kv_caches, attention_layers)
    try:
        yield context
    finally:
        _local.context = previous


def get_forward_context() -> ForwardContext:
    """The context of the forward running on this thread; RuntimeError outside one."""
    context = getattr(_local, "context", None)
    if context is None:
        raise RuntimeError("no forward context is set: the attention op runs only inside "
                           "set_forward_context(...) (mini/compilation.py sets it around a compiled forward)")
    return context
