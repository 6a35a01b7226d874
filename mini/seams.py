"""The named places where another implementation may stand in for the engine's own.

Mirrors the idea of vllm/model_executor/custom_op.py: vLLM registers its ops by name
(`CustomOp.register("rms_norm")`) and each op dispatches, at call time, to the implementation chosen for
the platform (`forward_native`, `forward_cuda`, ...); out-of-tree code can register its own op under an
existing name (`CustomOp.register_oot`). mini keeps the same shape, smaller: a reference function or
class is registered under a name, and the engine always reaches it through that name, so a replacement
installed with `override(...)` runs inside a live engine without patching any module.

    @seam("store_kv")                  # a function or method: calls dispatch through the registry
    def store_kv(key, value, kv_cache, slot_mapping): ...

    register("FreeKVCacheBlockQueue", FreeKVCacheBlockQueue)     # a class or a Triton kernel:
    queue_cls = implementation("FreeKVCacheBlockQueue")          # the engine asks for it where it uses it

    with override(store_kv=my_store_kv):                          # what the course's `plug` does
        llm.generate(...)

A replacement has the reference's signature (for a method: a function taking `self`). Overrides are
process-wide, like vLLM's op registry, so an engine loop running in another thread sees them too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_REFERENCE: dict[str, Any] = {}
_OVERRIDE: dict[str, Any] = {}


def register(name: str, reference: Any) -> Any:
    """Declare `reference` (a class, a kernel, any object) as the engine's implementation of `name`."""
    if name in _REFERENCE and _REFERENCE[name] is not reference:
        raise ValueError(f"seam {name!r} is already registered to {_REFERENCE[name]!r}")
    _REFERENCE[name] = reference
    return reference


def seam(name: str) -> Callable[[F], F]:
    """Decorator: register a function (or method) as seam `name`; calls go to the active implementation."""

    def decorate(reference: F) -> F:
        register(name, reference)

        @functools.wraps(reference)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            return _OVERRIDE.get(name, reference)(*args, **kwargs)

        dispatch.seam_name = name  # type: ignore[attr-defined]
        return dispatch  # type: ignore[return-value]

    return decorate


def implementation(name: str) -> Any:
    """The object that runs for seam `name` now: an override if one is installed, else the reference."""
    if name not in _REFERENCE:
        raise KeyError(f"no seam named {name!r}; seams: {names()}")
    return _OVERRIDE.get(name, _REFERENCE[name])


def reference(name: str) -> Any:
    """The engine's own implementation of seam `name`, whatever is installed."""
    return _REFERENCE[name]


def is_overridden(name: str) -> bool:
    """True while a replacement for seam `name` is installed (fused fast paths step aside then)."""
    return name in _OVERRIDE


def any_overridden() -> bool:
    """True while any replacement is installed (a captured CUDA graph, which cannot see one, steps aside)."""
    return bool(_OVERRIDE)


def names() -> list[str]:
    """Every registered seam (importing `mini` registers them all)."""
    return sorted(_REFERENCE)


@contextlib.contextmanager
def override(**replacements: Any) -> Iterator[None]:
    """Install replacements by seam name inside the `with` block; restore the previous ones on exit."""
    unknown = sorted(set(replacements) - set(_REFERENCE))
    if unknown:
        raise ValueError(f"unknown seam(s) {unknown}; seams: {names()}")
    for name, replacement in replacements.items():
        if replacement is None:
            raise TypeError(f"override({name}=None): pass a function, a class or a kernel")
    previous = {name: _OVERRIDE.get(name) for name in replacements}
    _OVERRIDE.update(replacements)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                _OVERRIDE.pop(name, None)
            else:
                _OVERRIDE[name] = value
