"""Mirrors vllm/v1/sample/logits_processor/interface.py: the logits-processor contract.

A logits processor edits the whole batch's logits at once. It is stateful: it keeps each row's
settings, and the persistent batch tells it how rows changed since the last step with a `BatchUpdate`
that must be processed in the order removes -> adds -> moves:

* removed: row indices whose request left (without a replacement);
* added: `(index, params, prompt_token_ids, output_token_ids)`; the output list is the request's live
  list, passed by reference, so it grows as tokens are generated; an add on an occupied row replaces it;
* moved: `(a, b, UNIDIRECTIONAL)` moves row a to b (b's old request is discarded, a becomes empty);
  `(a, b, SWAP)` exchanges rows a and b. Moves are applied after the adds, in list order.

`update_state(None)` means the batch makeup did not change (output lists may still have grown).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams


class MoveDirectionality(enum.Enum):
    """A one-way move a -> b, or a two-way swap a <-> b."""

    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


# (row index, params, prompt token ids, output token ids by reference)
AddedRequest = tuple[int, "SamplingParams", list[int], list[int]]
# (row a, row b, directionality)
MovedRequest = tuple[int, int, MoveDirectionality]
# row index of a request that left without replacement
RemovedRequest = int


@dataclass(frozen=True, slots=True)
class BatchUpdate:
    """How the persistent batch changed since the previous step."""

    batch_size: int  # number of occupied rows after the changes
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


@dataclass(frozen=True, slots=True)
class LogitsProcessorConfig:
    """The engine facts a processor may need (stands in for vLLM's VllmConfig).

    `engine_config` is the engine's EngineConfig when the engine builds the processors, else None.
    """

    vocab_size: int
    max_num_reqs: int = 256
    engine_config: Any = None


class LogitsProcessor(ABC):
    """Base class of built-in and custom processors (same four methods as vLLM's)."""

    @abstractmethod
    def __init__(self, vllm_config: LogitsProcessorConfig, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Transform the [num_rows, vocab_size] logits (in place or not) and return them."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if the processor never changes a row's argmax (then it is skipped for all-greedy batches)."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Digest the batch changes (None: no change) before this step's `apply`."""
        raise NotImplementedError
