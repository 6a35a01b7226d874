"""The attention-mask view: which cached KV slots each query token of one step attends to.

Mirrors no single vllm/v1 file; it draws the rule the attention backends apply
(vllm/v1/attention/backends/flash_attn.py, mini: mini/attention/reference.py `paged_attention`):
query row t of request i sits at position `p = seq_lens[i] - q_len_i + (t - query_start_loc[i])`
and reads the K/V of positions `0..p` of request i, found through its block table in the paged cache.
A prefill chunk and a decode are the same rule; the picture shows a mixed batch of both.

- `attention_mask_view(...)` / `attention_mask_from_batch(...)` -> `AttentionMaskView`: plain data;
- `plot_attention_mask(view)`: static matplotlib, query rows x physical cache slots (grouped by block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labs.views.colors import request_colors
from labs.views.recording import BatchInputs


@dataclass(slots=True)
class QueryRow:
    """One query token of the step and the cache slots it reads."""

    row: int  # flat row in the batch
    req_id: str
    position: int  # its position in its own request
    slot: int  # where its own K/V is written this step (it attends to itself too)
    attended_slots: list[int]  # the slots of positions 0..position of its request, in position order
    color: str


@dataclass(slots=True)
class AttentionMaskView:
    block_size: int
    num_slots: int  # num_blocks * block_size: the whole cache of one layer
    req_ids: list[str]
    rows: list[QueryRow]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]
    colors: dict[str, str]

    def dense(self) -> list[list[bool]]:
        """`[num_query_rows][num_slots]`: True where the row attends to the slot."""
        mask = [[False] * self.num_slots for _ in self.rows]
        for index, row in enumerate(self.rows):
            for slot in row.attended_slots:
                mask[index][slot] = True
        return mask

    def blocks_in_use(self) -> list[int]:
        """The physical blocks some query reads, in block-id order (the columns of the plot)."""
        return sorted({slot // self.block_size for row in self.rows for slot in row.attended_slots})

    def kind(self, req_id: str) -> str:
        """'decode' (one new token over its context), 'prefill' (nothing cached yet: every key is new this
        step) or 'prefill chunk' (several new tokens over an already cached part)."""
        req = self.req_ids.index(req_id)
        query_len = self.query_start_loc[req + 1] - self.query_start_loc[req]
        if query_len == 1 and self.seq_lens[req] > 1:
            return "decode"
        return "prefill" if query_len == self.seq_lens[req] else "prefill chunk"


def attention_mask_view(
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    block_table: Sequence[Sequence[int]],
    block_size: int,
    num_blocks: int | None = None,
    req_ids: Sequence[str] | None = None,
) -> AttentionMaskView:
    """The mask paged attention applies for this step's metadata (lists or tensors)."""
    query_start_loc = [int(x) for x in _as_list(query_start_loc)]
    seq_lens = [int(x) for x in _as_list(seq_lens)]
    table = [[int(b) for b in row] for row in _as_list(block_table)]
    names = list(req_ids) if req_ids is not None else [f"r{i}" for i in range(len(seq_lens))]
    colors = request_colors(names)
    rows = []
    for req, (req_id, seq_len) in enumerate(zip(names, seq_lens, strict=False)):
        start, end = query_start_loc[req], query_start_loc[req + 1]
        slots = [table[req][pos // block_size] * block_size + pos % block_size for pos in range(seq_len)]
        for row in range(start, end):
            position = seq_len - (end - start) + (row - start)
            rows.append(
                QueryRow(
                    row, req_id, position, slots[position], slots[: position + 1], colors.get(req_id, "#999")
                )
            )
    if num_blocks is None:
        num_blocks = max((b for row in table for b in row), default=0) + 1
    return AttentionMaskView(
        block_size, num_blocks * block_size, names, rows, query_start_loc, seq_lens, table, colors
    )


def attention_mask_from_batch(
    batch: BatchInputs,
    block_size: int,
    num_blocks: int | None = None,
    request_ids: Sequence[str] | None = None,
) -> AttentionMaskView:
    """The view of one recorded engine step (`recording.snapshots[k].batch`)."""
    view = attention_mask_view(
        batch.query_start_loc, batch.seq_lens, batch.block_table, block_size, num_blocks, batch.req_ids
    )
    if request_ids is not None:  # keep each request's colour stable across steps
        view.colors = request_colors(list(request_ids))
        for row in view.rows:
            row.color = view.colors.get(row.req_id, "#999")
    return view


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def plot_attention_mask(view: AttentionMaskView, ax: Any = None) -> Any:
    """Query rows (top to bottom) x the cache slots of the blocks in use (left to right, by block id).

    A light cell: cached context the row reads; a dark cell with a black edge: the row's own slot,
    written this step; grey: not read.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    blocks = view.blocks_in_use()
    bs = view.block_size
    column_of = {
        block * bs + offset: index * bs + offset for index, block in enumerate(blocks) for offset in range(bs)
    }
    width, height = len(blocks) * bs, len(view.rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.32 * width + 2.4, 0.32 * height + 1.4))
    for y, row in enumerate(view.rows):
        read = set(row.attended_slots)
        for slot, x in column_of.items():
            own = slot == row.slot
            face = row.color if slot in read else "#eeeeee"
            ax.add_patch(
                Rectangle(
                    (x, -y),
                    0.92,
                    0.92,
                    facecolor=face,
                    alpha=1.0 if own else (0.4 if slot in read else 1.0),
                    edgecolor="black" if own else "none",
                    linewidth=1.2,
                )
            )
        ax.text(
            -0.3,
            -y + 0.46,
            f"{row.req_id} pos {row.position}",
            ha="right",
            va="center",
            fontsize=7,
            color=row.color,
        )
    for slot, x in column_of.items():  # the physical slot number under each column
        ax.text(x + 0.46, -height + 0.75, str(slot), ha="center", va="top", fontsize=5, color="#666")
    for index, block in enumerate(blocks):
        x0 = index * bs
        ax.plot([x0 - 0.04, x0 - 0.04], [-height + 0.9, 1.0], color="#555", linewidth=0.8)
        ax.text(x0 + bs / 2, 1.25, f"block {block}", ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-4.5, width + 0.3)
    ax.set_ylim(-height + 0.2, 2.2)
    ax.set_axis_off()
    kinds = ", ".join(f"{r}: {view.kind(r)}" for r in view.req_ids)
    ax.set_title(f"which cache slots each query token reads ({kinds})", fontsize=8, loc="left")
    return ax
