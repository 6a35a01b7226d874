"""The persistent block table: one row of physical block ids per batch row, kept from step to step.

Mirrors vllm/v1/worker/block_table.py (BlockTable: `add_row`, `append_row`, `move_row`, ...). Phase 02's
`prepare_inputs` rebuilds the padded `[B, max_blocks]` table from Python lists every step, which is the
clearest way to see what it holds; a real engine keeps one tensor alive instead and writes only what
changed: a request that stays in its row gets only its NEW block ids appended (a decode step adds at most
one block), and only a row whose request changed (a new, resumed or moved request) is rewritten.

vLLM moves rows when the batch is condensed (`move_row`); mini syncs each row against the request it
holds (`sync_row`), which costs the same for a moved row and keeps `InputBatch.condense` (a phase-09
exercise) about rows only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_INITIAL_WIDTH = 16  # block columns; doubled whenever a request outgrows them


class BlockTable:
    """`int32 [max_num_reqs, width]`, 0-padded (block 0 is the null block), plus each row's owner and length."""

    def __init__(self, max_num_reqs: int, device: torch.device | str = "cpu") -> None:
        self.max_num_reqs = max_num_reqs
        self.table = torch.zeros((max_num_reqs, _INITIAL_WIDTH), dtype=torch.int32, device=device)
        self.num_blocks_per_row = [0] * max_num_reqs
        # The request state each row was last written for. Compared by identity, not by request id: a
        # request id can come back (a new request reusing it, or a preempted one resumed with new blocks).
        self.row_owners: list[object | None] = [None] * max_num_reqs

    def _ensure_width(self, num_blocks: int) -> None:
        width = self.table.shape[1]
        if num_blocks <= width:
            return
        while width < num_blocks:
            width *= 2
        wider = self.table.new_zeros((self.max_num_reqs, width))
        wider[:, : self.table.shape[1]] = self.table
        self.table = wider

    def add_row(self, row: int, owner: object, block_ids: Sequence[int]) -> None:
        """Row `row` now holds `owner` (a request's state), whose blocks are `block_ids` (the row is overwritten)."""
        self._ensure_width(len(block_ids))
        self.table[row].zero_()
        if block_ids:
            self.table[row, : len(block_ids)] = torch.as_tensor(list(block_ids), dtype=torch.int32)
        self.num_blocks_per_row[row] = len(block_ids)
        self.row_owners[row] = owner

    def append_row(self, row: int, block_ids: Sequence[int]) -> None:
        """Add `block_ids` after the row's current blocks (what a running request was given this step)."""
        if not block_ids:
            return
        start = self.num_blocks_per_row[row]
        self._ensure_width(start + len(block_ids))
        self.table[row, start: start + len(block_ids)] = torch.as_tensor(list(block_ids), dtype=torch.int32)
        self.num_blocks_per_row[row] = start + len(block_ids)

    def sync_row(self, row: int, owner: object, block_ids: Sequence[int]) -> None:
        """Make row `row` equal `owner`'s `block_ids`, writing only the new tail when the row already holds it."""
        if self.row_owners[row] is not owner or self.num_blocks_per_row[row] > len(block_ids):
            self.add_row(row, owner, block_ids)
        else:
            self.append_row(row, block_ids[self.num_blocks_per_row[row]:])

    def get(self, num_reqs: int) -> torch.Tensor:
        """Rows `0..num_reqs-1`, cut to the longest of them: the same shape as phase 02's `make_block_table`."""
        width = max(self.num_blocks_per_row[:num_reqs], default=0) or 1
        return self.table[:num_reqs, :width]
