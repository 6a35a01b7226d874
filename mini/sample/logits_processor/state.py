"""Mirrors vllm/v1/sample/logits_processor/state.py: recording batch changes and holding the processors.

`BatchUpdateBuilder` is what the persistent batch (mini/worker/input_batch.py) writes to while it
reorganizes rows during a step; `get_and_reset(batch_size)` then hands the processors one
`BatchUpdate` (or None when nothing changed). A removed row that a new request fills in the same step
is popped from the removed list (`pop_removed`), so it shows up only as an add, as in vLLM.

`LogitsProcessors` holds an engine's processors, split as the sampler uses them. It is also the home of
four parts of the sampler role (mini/roles.py): `process_dict_updates`, the standard way for a processor
that keeps `{row: state}` to follow a `BatchUpdate` (defined in builtin.py, as vLLM's), which it hands to
the built-in processors it builds, and the three built-in classes it builds (`MinPLogitsProcessor`,
`LogitBiasLogitsProcessor`, `MinTokensLogitsProcessor`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mini.sample.logits_processor import builtin
from mini.sample.logits_processor.builtin import (
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


class BatchUpdateBuilder:
    """Accumulates removes / adds / moves during one step of persistent-batch bookkeeping."""

    def __init__(self) -> None:
        self._removed: list[RemovedRequest] = []
        self.added: list[AddedRequest] = []
        self.moved: list[MovedRequest] = []
        self.batch_changed = False

    @property
    def removed(self) -> list[RemovedRequest]:
        return sorted(self._removed)

    def removed_append(self, index: int) -> None:
        self._removed.append(index)
        self.batch_changed = True

    def has_removed(self) -> bool:
        return bool(self._removed)

    def peek_removed(self) -> int | None:
        """Lowest removed row not yet refilled, or None."""
        return min(self._removed) if self._removed else None

    def pop_removed(self) -> int | None:
        """Take the lowest removed row (a new request is about to fill it), or None."""
        if not self._removed:
            return None
        lowest = min(self._removed)
        self._removed.remove(lowest)
        return lowest

    def added_append(self, added: AddedRequest) -> None:
        self.added.append(added)
        self.batch_changed = True

    def moved_append(self, moved: MovedRequest) -> None:
        if not isinstance(moved[2], MoveDirectionality):
            raise TypeError(
                f"moved[2] must be a MoveDirectionality (UNIDIRECTIONAL or SWAP), got {moved[2]!r}")
        self.moved.append(moved)
        self.batch_changed = True

    def reset(self) -> bool:
        """Forget the recorded changes; return whether there were any."""
        changed = self.batch_changed
        self._removed, self.added, self.moved = [], [], []
        self.batch_changed = False
        return changed

    def get_and_reset(self, batch_size: int) -> BatchUpdate | None:
        """The step's BatchUpdate (None if the batch did not change), then start afresh."""
        if not self.batch_changed:
            return None
        update = BatchUpdate(batch_size=batch_size, removed=self.removed, added=list(self.added),
                             moved=list(self.moved))
        self.reset()
        return update


@dataclass(slots=True)
class LogitsProcessors:
    """The loaded processors, split as the sampler uses them.

    Built by `build` from the class `roles.resolve(config, LogitsProcessors)` gives (mini/roles.py): its
    `MinPLogitsProcessor`, `LogitBiasLogitsProcessor` and `MinTokensLogitsProcessor` are the built-in classes
    it instantiates, and its `process_dict_updates` the one its built-in processors follow the batch with.
    """

    argmax_invariant: list[LogitsProcessor] = field(default_factory=list)
    non_argmax_invariant: list[LogitsProcessor] = field(default_factory=list)

    process_dict_updates: ClassVar = staticmethod(process_dict_updates)
    MinPLogitsProcessor: ClassVar[type[LogitsProcessor]] = builtin.MinPLogitsProcessor
    LogitBiasLogitsProcessor: ClassVar[type[LogitsProcessor]] = builtin.LogitBiasLogitsProcessor
    MinTokensLogitsProcessor: ClassVar[type[LogitsProcessor]] = builtin.MinTokensLogitsProcessor

    @classmethod
    def build(cls, config: LogitsProcessorConfig, device: torch.device, is_pin_memory: bool = False,
              custom_classes: Sequence[type[LogitsProcessor]] = ()) -> LogitsProcessors:
        """One instance of each built-in (min-p, logit bias, min tokens), then of each custom class."""
        container = cls()
        for processor_class in (cls.MinPLogitsProcessor, cls.LogitBiasLogitsProcessor, cls.MinTokensLogitsProcessor,
                                *custom_classes):
            container.add(container.instantiate(processor_class, config, device, is_pin_memory))
        return container

    def instantiate(self, processor_class: type[LogitsProcessor], config: LogitsProcessorConfig,
                    device: torch.device, is_pin_memory: bool) -> LogitsProcessor:
        """`processor_class(config, device, is_pin_memory)`; a row-state processor that inherits the base's
        `process_dict_updates` follows rows with this container's (the reference one, or the engine's
        replacement: the same assignment either way, nothing asks which)."""
        processor = processor_class(config, device, is_pin_memory)
        if isinstance(processor, RowStateLogitsProcessor) and _inherits_process_dict_updates(processor_class):
            processor.process_dict_updates = self.process_dict_updates
        return processor

    def add(self, processor: LogitsProcessor) -> None:
        if processor.is_argmax_invariant():
            self.argmax_invariant.append(processor)
        else:
            self.non_argmax_invariant.append(processor)

    @property
    def all(self) -> Iterator[LogitsProcessor]:
        yield from self.argmax_invariant
        yield from self.non_argmax_invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        for processor in self.all:
            processor.update_state(batch_update)


def _inherits_process_dict_updates(processor_class: type) -> bool:
    """True when `processor_class` keeps RowStateLogitsProcessor's `process_dict_updates` (a custom processor
    that defines its own keeps it)."""
    return (inspect.getattr_static(processor_class, "process_dict_updates", None)
            is inspect.getattr_static(RowStateLogitsProcessor, "process_dict_updates"))
