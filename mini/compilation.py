"""torch.compile for the model's forward pass, as vLLM's compilation config.

Mirrors vllm/config/compilation.py::CompilationConfig (its `mode`, a vllm/config/compilation.py::CompilationMode)
and the idea of vllm/compilation/backends.py: compile the model once for a symbolic number of tokens, and split
the graph at every attention call (vLLM's piecewise compilation: attention reads the paged KV cache through
per-step metadata, so it stays an eager op between compiled pieces).

mini takes `compilation_config` as an int (the mode) or a dict `{"mode": N}`:

* 0, `NONE` (mini's default): eager PyTorch.
* 3, `VLLM_COMPILE`: `torch.compile` (inductor; on a CPU its C++ backend) of `LlamaForCausalLM.forward` with a
  dynamic token dimension, every attention backend call left out of the graph (`torch.compiler.disable`), so a
  step of any batch size reuses the same compiled pieces (no recompilation per step; torch.compile specializes a
  dimension of size 1, so the first one-token step compiles once more). vLLM's own mode 3 adds
  custom fusion passes and caches the compiled artifacts on disk; mini does neither.

vLLM's modes 1 and 2 (stock torch.compile, a single Dynamo trace) are rejected with the list of the modes mini
has. Why mini's default stays 0: the README's benchmark section (`python -m mini bench compile` measures the
compile seconds and the speed with and without).
"""

from __future__ import annotations

import enum
from typing import Any

import torch


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
        raise ValueError(f"compilation_config mode must be one of {allowed} (0: eager, 3: torch.compile split at "
                         f"attention), got {value!r}")
    return CompilationMode(value)


class _EagerAttention:
    """A layer's attention backend with every function kept out of the compiled graph."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._wrapped: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if not callable(value):
            return value
        if name not in self._wrapped:
            self._wrapped[name] = torch.compiler.disable(value)
        return self._wrapped[name]


def compile_model(model: torch.nn.Module, mode: CompilationMode) -> torch.nn.Module:
    """Compile `model.forward` in place for `mode` (NONE: untouched); returns the model."""
    if mode == CompilationMode.NONE:
        return model
    for layer in model.model.layers:
        layer.self_attn.backend = _EagerAttention(layer.self_attn.backend)
    model.forward = torch.compile(model.forward, backend="inductor", dynamic=True)
    return model
