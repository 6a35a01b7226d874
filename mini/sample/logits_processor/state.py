"""Mirrors vllm/v1/sample/logits_processor/state.py: recording batch changes and holding the processors.

`BatchUpdateBuilder` is what the persistent batch (mini/worker/input_batch.py) writes to while it
reorganizes rows during a step; `get_and_reset(batch_size)` then hands the processors one
`BatchUpdate` (or None when nothing changed). A removed row that a new request fills in the same step
is popped from the removed list (`pop_removed`), so it shows up only as an add, as in vLLM.

`process_dict_updates` is the standard way for a processor that keeps `{row: state}` to follow a
`BatchUpdate` (vLLM keeps it in logits_processor/builtin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from mini.sample.logits_processor.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)
from mini.seams import seam

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams

StateT = TypeVar("StateT")


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
    """The loaded processors, split as the sampler uses them."""

    argmax_invariant: list[LogitsProcessor] = field(default_factory=list)
    non_argmax_invariant: list[LogitsProcessor] = field(default_factory=list)

    @classmethod
    def from_processors(cls, processors: list[LogitsProcessor]) -> LogitsProcessors:
        container = cls()
        for processor in processors:
            container.add(processor)
        return container

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


@seam("process_dict_updates")
def process_dict_updates(
    entries: dict[int, StateT],
    batch_update: BatchUpdate | None,
    new_state: Callable[[SamplingParams, list[int], list[int]], StateT | None],
) -> bool:
    """Apply removes -> adds -> moves to `{row: state}`; return whether `entries` changed.

    `new_state(params, prompt_ids, output_ids)` returns the row's state, or None if the processor
    is off for that request (then any stale state of the replaced request is dropped).
    """
    if batch_update is None:
        return False
    changed = False
    for index in batch_update.removed:
        changed |= entries.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[index] = state
            changed = True
        else:
            changed |= entries.pop(index, None) is not None
    for a_index, b_index, direction in batch_update.moved:
        a_state = entries.pop(a_index, None)
        b_state = entries.pop(b_index, None)
        if a_state is not None:
            entries[b_index] = a_state
            changed = True
        if b_state is not None:
            changed = True
            if direction is MoveDirectionality.SWAP:
                entries[a_index] = b_state
    return changed
