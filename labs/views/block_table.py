"""Mirrors no single vllm/v1 file: the block-table view (KV pool grid, block tables, free queue).

It draws the state of vllm/v1/core/block_pool.py (blocks, ref
counts, the free-block queue, the null block 0) and vllm/v1/core/kv_cache_manager.py (block tables).

Three layers, so each can be used (and tested) alone:
- `block_table_view(snapshot, request_ids)` -> `BlockTableView`: plain data (unit-tested);
- `render_block_table_html(view)` / `plot_block_table(view)`: HTML, or a static matplotlib figure
  for places with no widget front end (nbconvert, GitHub);
- `block_table_widget(recording)`: ipywidgets, a step slider replaying a recorded engine run.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labs.views.colors import FREE_COLOR, NULL_COLOR, SHARED_COLOR, request_colors
from labs.views.recording import EngineRecording, KVSnapshot


@dataclass(slots=True)
class BlockCell:
    block_id: int
    ref_cnt: int
    owners: list[str]
    state: str  # "null" | "free" | "used" | "shared"
    free_position: int | None  # place in the free queue, 0 = handed out next; None if not free
    color: str


@dataclass(slots=True)
class BlockTableView:
    step: int
    block_size: int
    cells: list[BlockCell]
    block_tables: dict[str, list[int]]
    num_computed_tokens: dict[str, int]
    free_queue: list[int]
    running: list[str]
    waiting: list[str]
    events: list[str]
    colors: dict[str, str]


def block_table_view(snapshot: KVSnapshot, request_ids: Sequence[str] | None = None) -> BlockTableView:
    colors = request_colors(list(request_ids) if request_ids is not None else sorted(snapshot.block_tables))
    owners = snapshot.owners()
    free_position = {block_id: index for index, block_id in enumerate(snapshot.free_queue)}
    cells = []
    for block_id, ref_cnt in enumerate(snapshot.ref_cnts):
        holders = owners.get(block_id, [])
        if block_id == 0:
            state, color = "null", NULL_COLOR
        elif ref_cnt == 0:
            state, color = "free", FREE_COLOR
        elif ref_cnt > 1 or len(holders) > 1:
            state, color = "shared", SHARED_COLOR
        else:
            state, color = "used", colors.get(holders[0], SHARED_COLOR) if holders else SHARED_COLOR
        cells.append(BlockCell(block_id, ref_cnt, holders, state, free_position.get(block_id), color))
    return BlockTableView(
        step=snapshot.step,
        block_size=snapshot.block_size,
        cells=cells,
        block_tables=dict(snapshot.block_tables),
        num_computed_tokens=dict(snapshot.num_computed_tokens),
        free_queue=list(snapshot.free_queue),
        running=list(snapshot.running),
        waiting=list(snapshot.waiting),
        events=list(snapshot.events),
        colors=colors,
    )


def _cell_html(cell: BlockCell) -> str:
    text_color = "#fff" if cell.state in ("null", "used", "shared") else "#333"
    title = f"block {cell.block_id}: {cell.state}, ref_cnt={cell.ref_cnt}"
    title += f", owners={cell.owners}" if cell.owners else ""
    title += f", free-queue position {cell.free_position}" if cell.free_position is not None else ""
    label = "null" if cell.state == "null" else f"rc={cell.ref_cnt}"
    return (
        f'<div title="{html.escape(title)}" style="width:46px;height:38px;background:{cell.color};'
        f"color:{text_color};border:1px solid #999;font:11px monospace;text-align:center;"
        f'display:inline-block;margin:1px;line-height:17px"><b>{cell.block_id}</b><br>{label}</div>'
    )


def render_block_table_html(view: BlockTableView, columns: int = 16) -> str:
    rows = []
    for start in range(0, len(view.cells), columns):
        rows.append("<div>" + "".join(_cell_html(c) for c in view.cells[start : start + columns]) + "</div>")
    tables = "".join(
        f'<tr><td style="color:{view.colors.get(req_id, SHARED_COLOR)}"><b>{html.escape(req_id)}</b></td>'
        f"<td>{view.num_computed_tokens.get(req_id, 0)}</td><td>{ids}</td></tr>"
        for req_id, ids in view.block_tables.items()
    )
    events = "".join(f"<li>{html.escape(event)}</li>" for event in view.events) or "<li>(none)</li>"
    return (
        f"<div style='font-family:sans-serif'><b>step {view.step}</b> (block_size={view.block_size}); "
        f"running {view.running}, waiting {view.waiting}<br>{''.join(rows)}"
        f"<table><tr><th>request</th><th>computed tokens</th><th>block table</th></tr>{tables}</table>"
        f"<div>free queue (head &rarr; tail): {view.free_queue}</div>"
        f"<div>this step:<ul style='margin:0'>{events}</ul></div></div>"
    )


def plot_block_table(view: BlockTableView, ax: Any = None, columns: int = 16) -> Any:
    """Static matplotlib drawing of one step; returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    num_rows = -(-len(view.cells) // columns)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(columns, len(view.cells)) * 0.6 + 0.5, num_rows * 0.6 + 1.4))
    for cell in view.cells:
        x, y = cell.block_id % columns, -(cell.block_id // columns)
        ax.add_patch(Rectangle((x, y), 0.95, 0.9, facecolor=cell.color, edgecolor="#999"))
        dark = cell.state in ("null", "used", "shared")
        label = f"{cell.block_id}\n" + ("null" if cell.state == "null" else f"rc{cell.ref_cnt}")
        ax.text(
            x + 0.47, y + 0.45, label, ha="center", va="center", fontsize=7, color="white" if dark else "#333"
        )
    ax.set_xlim(-0.1, columns + 0.1)
    ax.set_ylim(-num_rows + 0.8, 1.1)
    ax.set_axis_off()
    tables = "; ".join(f"{req_id}: {ids}" for req_id, ids in view.block_tables.items()) or "(none)"
    ax.set_title(
        f"step {view.step}   block tables: {tables}\nfree queue head->tail: {view.free_queue}",
        fontsize=8,
        loc="left",
    )
    return ax


def block_table_widget(recording: EngineRecording, columns: int = 16) -> Any:
    """A step slider (with a play button) over a recorded run; each step redraws the HTML view."""
    import ipywidgets as widgets

    views = [block_table_view(s, recording.request_ids) for s in recording.snapshots]
    slider = widgets.IntSlider(value=0, min=0, max=len(views) - 1, description="step")
    play = widgets.Play(value=0, min=0, max=len(views) - 1, interval=700)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(render_block_table_html(views[0], columns))

    def show(change: dict) -> None:
        board.value = render_block_table_html(views[change["new"]], columns)

    slider.observe(show, names="value")
    box = widgets.VBox([widgets.HBox([play, slider]), board])
    box.views = views  # the plain data behind the widget, for tests and curious learners
    return box
