"""Run the real engine with a learner's implementation in place of the reference one.

    from mini import LLM, SamplingParams
    from labs import plug

    with plug(FreeKVCacheBlockQueue=MyQueue, get_new_blocks=my_get_new_blocks):
        llm = LLM(num_gpu_blocks_override=64)          # built inside: the pool uses MyQueue
        outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8))

Each keyword is a seam of the engine (mini/seams.py: the few named places it lets another
implementation stand in, as vLLM's op registry does); the phase tables in labs/checks/pNN.py say which
exercise fills which seam. Nothing is monkeypatched: `plug` installs the replacements in the engine's
registry for the `with` block and takes them out afterwards, even after an error.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from mini import seams

# Modules whose import registers seams; the Triton ones only where Triton imports.
_SEAM_MODULES = ("mini.engine.llm_engine", "mini.attention.reference")
_TRITON_SEAM_MODULE = "mini.attention.triton_paged"


def _register_all_seams() -> None:
    for module_name in _SEAM_MODULES:
        importlib.import_module(module_name)
    with contextlib.suppress(ImportError):
        importlib.import_module(_TRITON_SEAM_MODULE)


def lab_names() -> list[str]:
    """Every name `plug` accepts: the engine's seams."""
    _register_all_seams()
    return seams.names()


@contextlib.contextmanager
def plug(**replacements: Any) -> Iterator[None]:
    """Replace the engine's implementation of each named seam inside the `with` block."""
    names = lab_names()
    unknown = sorted(set(replacements) - set(names))
    if unknown:
        raise ValueError(f"unknown lab name(s) {unknown}; allowed names: {names}")
    for name, replacement in replacements.items():
        if not callable(replacement):
            raise TypeError(f"plug({name}=...) needs a function, a class or a kernel, "
                            f"got {type(replacement).__name__}")
    with seams.override(**replacements):
        yield
