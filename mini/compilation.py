"""torch.compile for the model's forward pass, as vLLM's compilation config.

Mirrors vllm/config/compilation.py::CompilationConfig (its `mode`, a vllm/config/compilation.py::CompilationMode)
and vllm/compilation/backends.py (`VllmBackend`): Dynamo traces the model ONCE for a symbolic number of tokens,
with every layer's attention a single opaque custom op (`mini::unified_attention`,
mini/attention/unified_attention.py; vLLM's `unified_attention_with_output`) that reads the step's metadata and
its layer's KV cache from the forward context (mini/forward_context.py, set here around each compiled call).
The graph has no break, so a step costs one guard check, and inductor fuses what lies between the attention
calls (RMSNorm, RoPE, SiLU-and-mul, residual adds; on a CPU as C++ loops, on a GPU as Triton kernels).

mini takes `compilation_config` as an int (the mode) or a dict `{"mode": N}`:

* 0, `NONE` (mini's default): eager PyTorch.
* 3, `VLLM_COMPILE`: the whole forward compiled by inductor once, its token dimension marked unbacked (never
  specialized, not even to 1), so a step of any batch size reuses the one graph.

What vLLM does beyond this: mode 3 on a GPU also SPLITS the traced graph at the attention ops
(`split_graph`, `splitting_ops`) and compiles each piece apart, so that the pieces between attention calls can be
captured as piecewise CUDA graphs, and it adds its own fusion passes and an on-disk cache of the compiled
artifacts. On a CPU vLLM turns mode 3 into mode 2 (`DYNAMO_TRACE_ONCE`, vllm/platforms/cpu.py): one trace, one
inductor graph, which is what mini's mode 3 is everywhere (mini captures whole decode steps as CUDA graphs,
mini/worker/cuda_graph.py, so it needs no pieces). vLLM's modes 1 and 2 are refused with the list of the modes
mini has, and so is mode 3 with tensor parallelism (mini's collectives, mini/distributed/, are not traceable).
Why mini's default stays 0: the README's benchmark section (`python -m mini bench compile` measures the compile
seconds and the speed with and without).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from mini.forward_context import set_forward_context


class CompilationMode(enum.IntEnum):
    """vLLM's modes (vllm/config/compilation.py::CompilationMode); mini implements NONE and VLLM_COMPILE."""

    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


SUPPORTED_MODES = (CompilationMode.NONE, CompilationMode.VLLM_COMPILE)


def parse_compilation_mode(value: Any) -> CompilationMode:
    """`compilation_config` (None, an int or {"mode": int}) -> the mode; ValueError naming the allowed values."""
    if value is None:
        return CompilationMode.NONE
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"mode"})
        if unknown:
            raise ValueError(f"compilation_config: mini supports only the key 'mode', got {unknown}")
        value = value.get("mode", 0)
    allowed = [int(mode) for mode in SUPPORTED_MODES]
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise ValueError(f"compilation_config mode must be one of {allowed} (0: eager, 3: torch.compile of the "
                         f"forward, attention an opaque op), got {value!r}")
    return CompilationMode(value)


def compile_model(model: torch.nn.Module, mode: CompilationMode) -> torch.nn.Module:
    """Compile `model.forward` in place for `mode` (NONE: untouched); returns the model.

    The compiled forward keeps the eager signature `(input_ids, positions, kv_caches, attn_metadata)`: it sets
    the forward context from its last two arguments and runs the traced graph, which never sees the metadata.
    """
    if mode == CompilationMode.NONE:
        return model
    attention_layers = [layer.self_attn for layer in model.model.layers]
    for attention in attention_layers:
        attention.use_attention_op = True
    eager_forward = model.forward

    def traced(input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        return eager_forward(input_ids, positions, kv_caches, None)   # the layers read the metadata from the context

    graph = torch.compile(traced, backend="inductor", dynamic=True, fullgraph=True)

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: Any) -> torch.Tensor:
        # The token count is a size the graph must not specialize on, not even 1 (a plain dynamic dimension would
        # compile the one-token step apart). vLLM's `DynamicShapesType.UNBACKED` marks it the same way
        # (vllm/compilation/decorators.py `_mark_dynamic_inputs`).
        for tensor in (input_ids, positions):
            torch._dynamo.decorators.mark_unbacked(tensor, 0, hint_override=tensor.shape[0])
        with set_forward_context(attn_metadata, kv_caches, attention_layers):
            return graph(input_ids, positions, kv_caches)

    model.forward = forward
    return model
