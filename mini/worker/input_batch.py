"""The persistent batch: which request sits in which row, kept from step to step.

Mirrors vllm/v1/worker/gpu_input_batch.py (CachedRequestState, InputBatch). Rows matter because row i of
the logits, of the sampling tensors and of every logits processor's state is the same request. Instead
of rebuilding everything each step, vLLM edits the batch in place, and tells the logits processors
what changed with a BatchUpdate (mini/sample/logits_processor/state.py). The rules:

  * remove: the request's row becomes a hole (recorded as `removed`);
  * add: a new request takes the LOWEST hole, else the row after the last one (recorded as `added`;
    a refilled hole is popped from `removed`, so it appears only as an add);
  * condense: while a hole lies below an occupied row, move the HIGHEST occupied row into the LOWEST
    hole (recorded as a one-way `moved` (from, to)). Afterwards rows 0..num_reqs-1 are all occupied.

Example: rows [A, B, C, D]; A and C finish, E arrives -> remove 0, remove 2, add E at 0 ->
[E, B, _, D] -> condense moves 3 -> 2 -> [E, B, D]. BatchUpdate: added [0], removed [2], moved [(3, 2)].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mini.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from mini.sample.logits_processor.state import BatchUpdateBuilder
from mini.worker.block_table import BlockTable
from mini.worker.token_ids_buffer import TokenIdsBuffer

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    """The runner's own copy of a request: tokens, blocks and how far its KV cache is filled."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the runner appends every kept sampled token (a live list)
    sampling_params: SamplingParams
    generator: torch.Generator | None  # set when sampling_params.seed is not None
    block_ids: list[int]
    num_computed_tokens: int
    # Speculative decoding: the drafts scheduled for verification this step (fed after all_token_ids).
    spec_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)


class InputBatch:
    """Rows of requests; holes appear on remove and disappear on `condense()`.

    Home of the `input_preparation` role's part `condense` (mini/roles.py): the model runner builds its
    batch with `roles.resolve(config, InputBatch)`.
    """


    def __init__(self, max_num_reqs: int, batch_update_builder: BatchUpdateBuilder | None = None) -> None:
        if not isinstance(max_num_reqs, int) or max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be a positive int, got {max_num_reqs!r}")
        self.max_num_reqs = max_num_reqs
        self.req_ids: list[str | None] = []  # row -> request id (None = hole)
        self.requests: list[CachedRequestState | None] = []  # row -> state (None = hole)
        self.req_id_to_index: dict[str, int] = {}
        self.batch_update_builder = batch_update_builder or BatchUpdateBuilder()
        # Row i's block ids, kept up to date by the model runner (`sync_row`) before each forward.
        self.block_table = BlockTable(max_num_reqs)
        # Row i's token ids (vLLM: `token_ids_cpu_tensor`), synced by the model runner before each forward.
        self.token_ids = TokenIdsBuffer(max_num_reqs)
        # Told each BatchUpdate `get_batch_update()` hands out (the runner sets it while a step observer
        # traces the step: mini/metrics/step_trace.py); None: nobody listens.
        self.batch_update_listener: Callable[[BatchUpdate | None], None] | None = None

    @property
    def num_reqs(self) -> int:
        """Occupied rows (after `condense()` these are exactly rows 0..num_reqs-1)."""
        return len(self.req_id_to_index)

    def lowest_hole(self) -> int | None:
        return next((row for row, req_id in enumerate(self.req_ids) if req_id is None), None)

    def add_request(self, state: CachedRequestState) -> int:
        """Put `state` in the lowest hole (or a new row at the end); return its row."""
        if state.req_id in self.req_id_to_index:
            raise ValueError(f"request {state.req_id!r} is already in the batch (row "
                             f"{self.req_id_to_index[state.req_id]})")
        row = self.lowest_hole()
        if row is None:
            if len(self.req_ids) >= self.max_num_reqs:
                raise ValueError(f"the batch is full: max_num_reqs={self.max_num_reqs} rows are occupied")
            row = len(self.req_ids)
            self.req_ids.append(None)
            self.requests.append(None)
        elif self.batch_update_builder.peek_removed() == row:
            self.batch_update_builder.pop_removed()  # refilled: reported as an add only
        self.req_ids[row] = state.req_id
        self.requests[row] = state
        self.req_id_to_index[state.req_id] = row
        self.batch_update_builder.added_append(
            (row, state.sampling_params, state.prompt_token_ids, state.output_token_ids)
        )
        return row

    def remove_request(self, req_id: str) -> int | None:
        """Empty the request's row (a hole until `condense()`); return the row, or None if absent."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.requests[row] = None
        self.batch_update_builder.removed_append(row)
        return row

    def condense(self) -> None:
        """Fill holes from the end: the highest occupied row moves into the lowest hole, repeatedly."""
        while True:
            while self.req_ids and self.req_ids[-1] is None:  # trailing holes just go away
                self.req_ids.pop()
                self.requests.pop()
            hole = self.lowest_hole()
            if hole is None:
                return
            last = len(self.req_ids) - 1
            req_id = self.req_ids[last]
            assert req_id is not None
            self.req_ids[hole], self.requests[hole] = req_id, self.requests[last]
            self.req_ids[last], self.requests[last] = None, None
            self.req_id_to_index[req_id] = hole
            self.batch_update_builder.moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))

    def get_batch_update(self) -> BatchUpdate | None:
        """This step's changes for the logits processors (None if none), then start recording afresh."""
        batch_update = self.batch_update_builder.get_and_reset(self.num_reqs)
        if self.batch_update_listener is not None:
            self.batch_update_listener(batch_update)
        return batch_update

    def occupied_requests(self) -> list[CachedRequestState]:
        """The states of rows 0..num_reqs-1 (call after `condense()`)."""
        states = [state for state in self.requests if state is not None]
        if len(states) != len(self.requests):
            raise RuntimeError("the batch has holes: call condense() first")
        return states
