"""mini: a small, readable vLLM-v1-style inference engine.

    from mini import LLM, SamplingParams
    llm = LLM()                                   # the tiny model shipped inside the package
    out = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0.0, max_tokens=32))
    print(out[0].outputs[0].text)

The public names are the same as vLLM's (vllm/__init__.py), so a script written against this subset
runs on vLLM after swapping the import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mini import roles  # the roles an implementation may be chosen for (no engine module is imported)

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "LoRARequest", "RequestOutput", "SamplingParams", "__version__", "roles"]

if TYPE_CHECKING:
    from mini.entrypoints.llm import LLM
    from mini.lora.request import LoRARequest
    from mini.outputs import CompletionOutput, RequestOutput
    from mini.sampling_params import SamplingParams

_LAZY = {
    "LLM": ("mini.entrypoints.llm", "LLM"),
    "SamplingParams": ("mini.sampling_params", "SamplingParams"),
    "LoRARequest": ("mini.lora.request", "LoRARequest"),
    "RequestOutput": ("mini.outputs", "RequestOutput"),
    "CompletionOutput": ("mini.outputs", "CompletionOutput"),
}


def __getattr__(name: str):
    """Import the public classes on first use, so `import mini.core...` stays light."""
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mini' has no attribute {name!r}")
