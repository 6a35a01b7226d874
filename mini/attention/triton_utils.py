"""Mirrors vllm/triton_utils/importing.py: find out whether Triton can run here, and import it safely.

vLLM guards every Triton import behind a platform check so that the rest of the engine works on
machines without Triton. We do the same, with one addition for the course: when there is no CUDA
GPU we switch Triton to its interpreter (``TRITON_INTERPRET=1``), which runs the very same kernels
on CPU tensors with NumPy. That switch must happen BEFORE ``import triton`` and before any
``@triton.jit`` function is defined, because Triton decides at decoration time whether a kernel is
compiled or interpreted. This module is safe to import anywhere; only :func:`import_triton` raises.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
from types import ModuleType

import torch

UNAVAILABLE_MESSAGE = (
    "The Triton attention backend needs the `triton` package, which is only available on Linux x86_64 "
    "(this machine: {system} {machine}{missing}). Everything else in mini works without it: "
    "use LLM(attention_backend='torch_fast') (the default on CPU) or 'torch' (phase 03's reference)."
)


def is_supported_platform() -> bool:
    """True on Linux x86_64, the only platform with official Triton wheels."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def is_available() -> bool:
    """True when the Triton backend can be used here (Linux x86_64 and ``triton`` installed)."""
    return is_supported_platform() and importlib.util.find_spec("triton") is not None


def unavailable_reason() -> str:
    """A human-readable explanation of why :func:`is_available` is False."""
    missing = "" if importlib.util.find_spec("triton") is not None else ", `triton` not installed"
    return UNAVAILABLE_MESSAGE.format(system=platform.system(), machine=platform.machine(), missing=missing)


def use_interpreter() -> bool:
    """True when kernels run under the Triton CPU interpreter (no CUDA device, or forced by env)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def import_triton() -> tuple[ModuleType, ModuleType]:
    """Return ``(triton, triton.language)``, turning the interpreter on first when there is no GPU.

    Raises ImportError with an explanation on platforms without Triton.
    """
    if not is_available():
        raise ImportError(unavailable_reason())
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton
    import triton.language as tl

    if use_interpreter():
        _interpret_triton_language()
    return triton, tl


def _interpret_triton_language() -> None:
    """Make Triton's own ``@triton.jit`` helpers (tl.zeros, tl.sum, tl.max, ...) interpretable.

    Triton picks compiled or interpreted mode when a function is decorated. Its standard library is
    decorated when ``triton`` is first imported, and transformers/torch often import it before we can
    set TRITON_INTERPRET; those helpers would then refuse to run inside an interpreted kernel. Wrapping
    them the way ``@triton.jit`` would have under TRITON_INTERPRET=1 fixes that (no-op if already done).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, InterpretedFunction] = {}
    language_modules = [
        module for name, module in list(sys.modules.items())
        if module is not None and (name == "triton.language" or name.startswith("triton.language."))
    ]
    for module in language_modules:
        for attribute, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:
                    wrapped[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attribute, wrapped[id(value)])


def next_power_of_2(value: int) -> int:
    """Smallest power of two >= value (tl.arange needs power-of-two lengths)."""
    if value < 1:
        raise ValueError(f"value must be >= 1, got {value}")
    return 1 << (value - 1).bit_length()
