"""Mirrors vllm/v1/sample/logits_processor/__init__.py: loading built-in and custom processors.

`build_logitsprocs(custom_classes, vocab_size, device)` instantiates the built-ins (min-p, logit bias,
min tokens) and any custom `LogitsProcessor` subclasses (given as classes or "module:Class" /
"module.Class" strings), and sorts them into argmax-invariant and non-invariant lists. `engine_config`'s
`parts` (what the engine replaced, mini/roles.py) pick the `LogitsProcessors` class that builds them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from mini import roles
from mini.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    RowStateLogitsProcessor,
    process_dict_updates,
)
from mini.sample.logits_processor.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    LogitsProcessorConfig,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)
from mini.sample.logits_processor.state import BatchUpdateBuilder, LogitsProcessors


def resolve_logitsproc_class(spec: type[LogitsProcessor] | str) -> type[LogitsProcessor]:
    """A LogitsProcessor subclass from a class or a "package.module:Class" / "package.module.Class" path."""
    if isinstance(spec, str):
        module_name, sep, class_name = spec.partition(":")
        if not sep:
            module_name, _, class_name = spec.rpartition(".")
        if not module_name or not class_name:
            raise ValueError(f"logits_processors entry {spec!r} must look like 'package.module:ClassName'")
        spec = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(spec, type) and issubclass(spec, LogitsProcessor)):
        raise TypeError("logits_processors entries must be LogitsProcessor subclasses "
                        f"(or their import path), "
                        f"got {spec!r}")
    return spec


def build_logitsprocs(
    custom_classes: Sequence[type[LogitsProcessor] | str] | None,
    vocab_size: int,
    device: torch.device | str = "cpu",
    *,
    engine_config: Any = None,
    max_num_reqs: int = 256,
    is_pin_memory: bool = False,
) -> LogitsProcessors:
    """The built-in processors plus one instance of each custom class, ready for update_state/apply."""
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    config = LogitsProcessorConfig(vocab_size=vocab_size, max_num_reqs=max_num_reqs,
                                   engine_config=engine_config)
    device = torch.device(device)
    custom = [resolve_logitsproc_class(c) for c in custom_classes or ()]
    return roles.resolve(engine_config, LogitsProcessors).build(config, device, is_pin_memory, custom)


__all__ = [
    "AddedRequest",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessorConfig",
    "LogitsProcessors",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "MovedRequest",
    "RemovedRequest",
    "RowStateLogitsProcessor",
    "build_logitsprocs",
    "process_dict_updates",
    "resolve_logitsproc_class",
]
