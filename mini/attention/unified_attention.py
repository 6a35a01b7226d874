"""Attention as ONE opaque PyTorch op, so torch.compile traces a whole forward without a graph break.

Mirrors vllm/model_executor/layers/attention/attention.py (`unified_kv_cache_update` and
`unified_attention_with_output`, registered with `direct_register_custom_op`): the op takes the layer's
query, key and value and returns its output; the step's metadata and the layer's KV cache come from the
forward context (mini/forward_context.py), never through the graph. Dynamo records one call node per layer,
inductor compiles everything around it and calls the op's eager body at run time, where the engine's
attention backend (torch_fast, torch or triton; any replaced part) does the work.

One difference: vLLM registers two ops (write the KV cache, then attend, with a dummy data dependency
between them to keep their order); mini's op does both, so their order is the op's own.
"""

from __future__ import annotations

import torch

from mini.forward_context import get_forward_context


@torch.library.custom_op("mini::unified_attention", mutates_args=())
def unified_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_index: int,
                      scale: float) -> torch.Tensor:
    """Layer `layer_index`: store this step's key/value in its paged cache, then attend -> `[T, Hq, D]`."""
    context = get_forward_context()
    backend = context.attention_layers[layer_index].backend
    kv_cache = context.kv_caches[layer_index]
    backend.store_kv(key, value, kv_cache, context.attn_metadata.slot_mapping)
    return backend.paged_attention(query, kv_cache, context.attn_metadata, scale)


@unified_attention.register_fake
def _unified_attention_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_index: int,
                            scale: float) -> torch.Tensor:
    """What tracing needs: the output has the query's shape, dtype and device."""
    return torch.empty_like(query)
