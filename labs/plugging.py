"""Build the real engine with a learner's implementation in place of the reference one.

    from mini import LLM, SamplingParams
    from labs import plug

    with plug(FreeKVCacheBlockQueue=MyQueue, get_new_blocks=my_get_new_blocks):
        llm = LLM(num_gpu_blocks_override=64)          # built inside: its block pool uses MyQueue
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8))

Each keyword is a part of one of the engine's roles (mini/roles.py: the few places where it lets an
implementation be chosen, as vLLM picks an op's or an attention backend's implementation when the model
is built); the phase tables in labs/checks/pNN.py say which exercise writes which part. Nothing is
monkeypatched and nothing is looked up per call: an engine *built* inside the `with` block chooses the
parts once, at construction, and keeps them; one built outside (or before) keeps the reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mini import roles


def lab_names() -> list[str]:
    """Every name `plug` accepts: the parts of the engine's roles."""
    return roles.part_names()


@contextlib.contextmanager
def plug(**replacements: Any) -> Iterator[None]:
    """Every engine built inside the `with` block uses these parts in place of its own."""
    names = lab_names()
    unknown = sorted(set(replacements) - set(names))
    if unknown:
        raise ValueError(f"unknown lab name(s) {unknown}; allowed names: {names}")
    for name, replacement in replacements.items():
        if not callable(replacement):
            raise TypeError(f"plug({name}=...) needs a function, a class or a kernel, "
                            f"got {type(replacement).__name__}")
    with roles.use(**replacements):
        yield
