"""torch.compile for the model's forward pass, as vLLM's compilation config.

Mirrors vllm/config/compilation.py::CompilationConfig (its `mode`, a vllm/config/compilation.py::CompilationMode,
and its `splitting_ops`) and vllm/compilation/wrapper.py (`torch.compile(..., fullgraph=True, dynamic=False)`):
Dynamo traces the model ONCE for a symbolic number of tokens, with every layer's attention a single opaque custom
op (`mini::unified_attention`, mini/attention/unified_attention.py; vLLM's `unified_attention_with_output`) that
reads the step's metadata and its layer's KV cache from the forward context (mini/forward_context.py, set here
around each compiled call). The graph has no break, so a step costs one guard check.

mini takes `compilation_config` as an int (the mode) or a dict `{"mode": N, "splitting_ops": [...]}`:

* 0, `NONE` (mini's default): eager PyTorch.
* 3, `VLLM_COMPILE`: the whole forward traced once, its token dimension marked unbacked (never specialized, not
  even to 1), so a step of any batch size reuses the one graph. The graph is then split at the attention ops and
  inductor compiles each piece between them (mini/piecewise_compile.py, vLLM's `split_graph` and piecewise
  backend), fusing what lies there (RMSNorm, RoPE, SiLU-and-mul, residual adds; on a CPU as C++ loops, on a GPU
  as Triton kernels). `splitting_ops=[]` compiles the forward as one inductor graph instead. A draft model for
  speculative decoding is compiled the same way (mini/spec_decode/draft_model.py); the EAGLE head is not.

Where mini differs from vLLM v0.33.0:
* On a CPU vLLM turns mode 3 into mode 2 (`DYNAMO_TRACE_ONCE`, vllm/platforms/cpu.py): one trace, one inductor
  graph, no split. mini splits on every device: on this project's CPU the split compiled SmolLM2 in about half the
  time, because the 30 layers' pieces are one piece to inductor's cache, and ran as fast (README, "torch.compile").
* vLLM captures each piece as a piecewise CUDA graph; mini captures whole decode steps
  (mini/worker/cuda_graph.py), so its pieces are for compile time only. vLLM also adds its own fusion passes and
  an on-disk cache of the compiled artifacts.
* vLLM's modes 1 and 2 are refused with the list of the modes mini has, and so is mode 3 with tensor
  parallelism (mini's collectives, mini/distributed/, are not traceable).

Why mini's default stays 0: the README's benchmark section (`python -m mini bench compile` measures the compile
seconds and the speed with and without).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from mini.forward_context import set_forward_context
from mini.piecewise_compile import ATTENTION_OPS, make_piecewise_backend


class CompilationMode(enum.IntEnum):
    """vLLM's modes (vllm/config/compilation.py::CompilationMode); mini implements NONE and VLLM_COMPILE."""

    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


SUPPORTED_MODES = (CompilationMode.NONE, CompilationMode.VLLM_COMPILE)


@dataclass(frozen=True)
class CompilationSettings:
    """What `compilation_config` asks for: the mode, and the ops the traced graph is split at (vLLM:
    `CompilationConfig.mode` and `.splitting_ops`; () = one graph)."""

    mode: CompilationMode
    splitting_ops: tuple[str, ...]


def parse_compilation_config(value: Any) -> CompilationSettings:
    """`compilation_config` (None, an int, or {"mode": int, "splitting_ops": list}) -> its settings; ValueError
    naming the field and the allowed values. `splitting_ops` None (the default) -> the attention op, as vLLM's
    default for mode 3; [] -> the whole forward as one graph."""
    splitting_ops: Any = None
    if value is None:
        value = 0
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"mode", "splitting_ops"})
        if unknown:
            raise ValueError(f"compilation_config: mini supports only the keys 'mode' and 'splitting_ops', got "
                             f"{unknown}")
        splitting_ops = value.get("splitting_ops")
        value = value.get("mode", 0)
    allowed = [int(mode) for mode in SUPPORTED_MODES]
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise ValueError(f"compilation_config mode must be one of {allowed} (0: eager, 3: torch.compile of the "
                         f"forward, attention an opaque op), got {value!r}")
    if splitting_ops is None:
        splitting_ops = list(ATTENTION_OPS)
    if not isinstance(splitting_ops, (list, tuple)) or any(op not in ATTENTION_OPS for op in splitting_ops):
        raise ValueError(f"compilation_config splitting_ops must be None, [] (one graph) or a list of "
                         f"{list(ATTENTION_OPS)} (split at attention), got {splitting_ops!r}")
    return CompilationSettings(CompilationMode(value), tuple(splitting_ops))


def parse_compilation_mode(value: Any) -> CompilationMode:
    """`compilation_config` -> its mode (ValueError as `parse_compilation_config`)."""
    return parse_compilation_config(value).mode


def compile_model(model: torch.nn.Module, settings: CompilationSettings) -> torch.nn.Module:
    """Compile `model.forward` in place for `settings` (mode NONE: untouched); returns the model.

    The compiled forward keeps the eager signature `(input_ids, positions, kv_caches, attn_metadata)`: it sets
    the forward context from its last two arguments and runs the traced graph, which never sees the metadata.
    """
    if settings.mode == CompilationMode.NONE:
        return model
    model.model.rotary_emb.inv_freq_on(next(model.parameters()).device)  # made before the trace, not during it
    attention_layers = [layer.self_attn for layer in model.model.layers]
    for attention in attention_layers:
        attention.use_attention_op = True
    eager_forward = model.forward

    def traced(input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        return eager_forward(input_ids, positions, kv_caches, None)   # the layers read the metadata from the context

    # As vLLM (vllm/compilation/wrapper.py): `dynamic=False`, and only the token dimension marked dynamic below.
    # With `dynamic=True` Dynamo would also take every float on the modules (RMSNorm's epsilon, the attention
    # scale) as a symbolic input, then restart the trace to specialize them: one more trace of the whole model.
    backend = make_piecewise_backend(settings.splitting_ops) if settings.splitting_ops else "inductor"
    graph = torch.compile(traced, backend=backend, dynamic=False, fullgraph=True)

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
