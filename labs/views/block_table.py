"""Mirrors no single vllm/v1 file: the block-table view (KV pool grid, block tables, free queue).

It draws the state of vllm/v1/core/block_pool.py (blocks, ref counts, the free-block queue, the null block 0)
and vllm/v1/core/kv_cache_manager.py (block tables). Each block is drawn as its `block_size` slots: a slot is
shaded once a token's K/V was written there (the request's computed tokens), so the empty tail of a
request's last block, its internal fragmentation, is visible. A block several requests hold (prefix
caching, phase 10) is striped in every owner's colour and lists its owners with its ref count.

Three layers, so each can be used (and tested) alone:
- `block_table_view(snapshot, request_ids)` -> `BlockTableView`: plain data (unit-tested);
- `render_block_table_html(view)` / `render_block_table_text(view)` / `plot_block_table(view)`: HTML, plain
  text, or a static matplotlib figure for places with no widget front end (nbconvert, GitHub);
- `block_table_widget(recording)`: ipywidgets, a step slider replaying a recorded engine run; its
  `text(step)` (and its `text/plain`) is the text view (labs/views/text_view.py).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labs.views.colors import FREE_COLOR, NULL_COLOR, SHARED_COLOR, request_colors
from labs.views.recording import EngineRecording, KVSnapshot
from labs.views.text_view import TextView, have_widgets, replay_text, view_box


@dataclass(slots=True)
class BlockCell:
    block_id: int
    ref_cnt: int
    owners: list[str]          # every request whose block table holds it, in arrival order
    state: str                 # "null" | "free" | "used" | "shared"
    free_position: int | None  # place in the free queue, 0 = handed out next; None if not free
    color: str                 # one owner's colour (SHARED_COLOR when several: see `owner_colors`)
    filled: int = 0            # slots holding a computed token's K/V (0 for free and null blocks)
    owner_colors: tuple[str, ...] = ()  # each owner's colour, in `owners` order (the stripes)
    empty: int = 0             # allocated but empty slots (internal fragmentation); 0 for free and null


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

    def allocated_slots(self) -> int:
        return self.block_size * sum(c.state in ("used", "shared") for c in self.cells)

    def empty_slots(self) -> int:
        """Slots of allocated blocks with no K/V yet: the internal fragmentation of this step."""
        return sum(c.empty for c in self.cells)


def slot_fill(block_tables: dict[str, list[int]], num_computed_tokens: dict[str, int],
              block_size: int) -> dict[int, int]:
    """Block id -> slots holding K/V: a request's i-th block holds min(block_size, computed - i * block_size)
    of its tokens (a block several requests share: the most any of them wrote)."""
    fill: dict[int, int] = {}
    for req_id, block_ids in block_tables.items():
        computed = num_computed_tokens.get(req_id, 0)
        for position, block_id in enumerate(block_ids):
            count = max(0, min(block_size, computed - position * block_size))
            fill[block_id] = max(fill.get(block_id, 0), count)
    return fill


def block_table_view(snapshot: KVSnapshot, request_ids: Sequence[str] | None = None) -> BlockTableView:
    order = list(request_ids) if request_ids is not None else sorted(snapshot.block_tables)
    colors = request_colors(order)
    rank = {req_id: index for index, req_id in enumerate(order)}
    owners = snapshot.owners()
    fill = slot_fill(snapshot.block_tables, snapshot.num_computed_tokens, snapshot.block_size)
    free_position = {block_id: index for index, block_id in enumerate(snapshot.free_queue)}
    cells = []
    for block_id, ref_cnt in enumerate(snapshot.ref_cnts):
        holders = sorted(owners.get(block_id, []), key=lambda r: rank.get(r, len(rank)))
        if block_id == 0:
            state, color = "null", NULL_COLOR
        elif ref_cnt == 0:
            state, color = "free", FREE_COLOR
        elif ref_cnt > 1 or len(holders) > 1:
            state, color = "shared", SHARED_COLOR
        else:
            state, color = "used", colors.get(holders[0], SHARED_COLOR) if holders else SHARED_COLOR
        filled = fill.get(block_id, 0) if state in ("used", "shared") else 0
        cells.append(BlockCell(
            block_id, ref_cnt, holders, state, free_position.get(block_id), color, filled,
            tuple(colors.get(h, SHARED_COLOR) for h in holders),
            snapshot.block_size - filled if state in ("used", "shared") else 0))
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


# ---------------------------------------------------------------------------------------------------- HTML


def _stripes(colors: Sequence[str]) -> str:
    """A CSS background striped in each owner's colour (one colour: plain)."""
    if len(colors) <= 1:
        return colors[0] if colors else SHARED_COLOR
    stops = ", ".join(f"{c} {i * 8}px {(i + 1) * 8}px" for i, c in enumerate(colors))
    return f"repeating-linear-gradient(135deg, {stops})"


def _slots_html(cell: BlockCell, block_size: int) -> str:
    slots = "".join(
        f'<span class="bt-slot {"bt-filled" if i < cell.filled else "bt-empty"}" style="display:inline-block;'
        f"width:7px;height:9px;margin:0 1px;border:1px solid #fff;"
        f'background:{"#1b1b1b" if i < cell.filled else "#fff"}"></span>'
        for i in range(block_size))
    return f"<div style='line-height:10px'>{slots}</div>"


def _cell_html(cell: BlockCell, block_size: int) -> str:
    title = f"block {cell.block_id}: {cell.state}, ref_cnt={cell.ref_cnt}"
    title += f", owners={cell.owners}" if cell.owners else ""
    title += f", {cell.filled}/{block_size} slots filled" if cell.state in ("used", "shared") else ""
    title += f", free-queue position {cell.free_position}" if cell.free_position is not None else ""
    width = max(56, block_size * 11 + 8)
    if cell.state == "null":
        body, background, text_color = "null", NULL_COLOR, "#fff"
    elif cell.state == "free":
        body, background, text_color = f"free #{cell.free_position}", FREE_COLOR, "#555"
    else:
        background, text_color = _stripes(cell.owner_colors or (cell.color,)), "#fff"
        owners = ",".join(cell.owners) or "?"
        body = (f"{_slots_html(cell, block_size)}<span class='bt-fill'>{cell.filled}/{block_size}</span>"
                f"<br><span class='bt-owners'>{html.escape(owners)}</span>"
                f" <span class='bt-ref'>ref {cell.ref_cnt}</span>")
    return (
        f'<div class="bt-block bt-{cell.state}" title="{html.escape(title)}" style="width:{width}px;'
        f"min-height:52px;background:{background};color:{text_color};border:1px solid #999;"
        f"font:10px monospace;text-align:center;display:inline-block;vertical-align:top;margin:1px;"
        f'line-height:13px;text-shadow:0 0 2px #000a"><b>{cell.block_id}</b><br>{body}</div>'
    )


def _legend_html(view: BlockTableView) -> str:
    def swatch(background: str, label: str) -> str:
        return (f"<span style='display:inline-block;width:14px;height:10px;background:{background};"
                f"border:1px solid #999;margin:0 3px 0 10px'></span>{html.escape(label)}")

    owners = "".join(swatch(color, req_id) for req_id, color in view.colors.items())
    first_two = list(view.colors.values())[:2] or [SHARED_COLOR, SHARED_COLOR]
    return (
        f"<div class='bt-legend' style='font:11px sans-serif;margin:4px 0'>legend:{owners}"
        f"{swatch(_stripes(first_two * (2 // len(first_two))), 'shared (stripes: every owner; ref = holders)')}"
        f"{swatch(FREE_COLOR, 'free (#n: place in the free queue)')}{swatch(NULL_COLOR, 'null block 0')}"
        f"<br>each block is {view.block_size} slots: dark = K/V written, white = allocated but empty "
        f"(internal fragmentation)</div>"
    )


def render_block_table_html(view: BlockTableView, columns: int = 16) -> str:
    rows = []
    for start in range(0, len(view.cells), columns):
        rows.append("<div>" + "".join(_cell_html(c, view.block_size)
                                      for c in view.cells[start: start + columns]) + "</div>")
    fill = {c.block_id: c.filled for c in view.cells}
    tables = "".join(
        f'<tr><td style="color:{view.colors.get(req_id, SHARED_COLOR)}"><b>{html.escape(req_id)}</b></td>'
        f"<td>{view.num_computed_tokens.get(req_id, 0)}</td><td>{ids}</td>"
        f"<td>{' '.join(f'{fill.get(b, 0)}/{view.block_size}' for b in ids)}</td></tr>"
        for req_id, ids in view.block_tables.items()
    )
    events = "".join(f"<li>{html.escape(event)}</li>" for event in view.events) or "<li>(none)</li>"
    allocated, empty = view.allocated_slots(), view.empty_slots()
    return (
        f"<div style='font-family:sans-serif'><b>step {view.step}</b> (block_size={view.block_size}); "
        f"running {view.running}, waiting {view.waiting}; <span class='bt-frag'>{empty} of {allocated} "
        f"allocated slots empty</span>{_legend_html(view)}{''.join(rows)}"
        f"<table><tr><th>request</th><th>computed tokens</th><th>block table</th><th>slots filled</th></tr>"
        f"{tables}</table>"
        f"<div>free queue (head &rarr; tail): {view.free_queue}</div>"
        f"<div>this step:<ul style='margin:0'>{events}</ul></div></div>"
    )


# ---------------------------------------------------------------------------------------------------- text


def _slots_text(filled: int, block_size: int) -> str:
    return "[" + "#" * filled + "." * (block_size - filled) + "]"


def render_block_table_text(view: BlockTableView) -> str:
    """The same step as plain text: one line per allocated block (slots, owners, ref count)."""
    lines = [f"step {view.step} (block_size={view.block_size}): running {view.running}, waiting {view.waiting}",
             (f"slots: # = K/V written, . = allocated but empty; {view.empty_slots()} of "
              f"{view.allocated_slots()} allocated slots empty (internal fragmentation)")]
    lines.append("  block   0 null (never handed out)")
    for cell in view.cells:
        if cell.state in ("used", "shared"):
            shared = "  shared" if cell.state == "shared" else ""
            lines.append(f"  block {cell.block_id:3d} {_slots_text(cell.filled, view.block_size)} "
                         f"{cell.filled}/{view.block_size}  owners {','.join(cell.owners) or '?'}  "
                         f"ref {cell.ref_cnt}{shared}")
    for req_id, ids in view.block_tables.items():
        lines.append(f"{req_id}: {view.num_computed_tokens.get(req_id, 0)} tokens computed, block table {ids}")
    lines.append(f"free queue (head -> tail): {view.free_queue}")
    lines.append("this step: " + ("; ".join(view.events) or "(none)"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- figure


def plot_block_table(view: BlockTableView, ax: Any = None, columns: int = 16) -> Any:
    """Static matplotlib drawing of one step (one patch per block, its slots drawn inside); returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    num_rows = -(-len(view.cells) // columns)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(columns, len(view.cells)) * 0.75 + 0.5, num_rows * 0.85 + 1.6))
    size = view.block_size
    for cell in view.cells:
        x, y = cell.block_id % columns, -(cell.block_id // columns) * 1.2
        owners = cell.owner_colors or (cell.color,)
        ax.add_patch(Rectangle((x, y), 0.95, 0.95, facecolor=owners[0] if cell.state != "free" else FREE_COLOR,
                               edgecolor="#999", hatch="//" if cell.state == "shared" else None))
        if cell.state in ("used", "shared"):
            for i in range(size):   # the slots, as lines: thick and dark = written
                x0 = x + 0.06 + i * 0.83 / size
                ax.plot([x0, x0 + 0.75 / size], [y + 0.12, y + 0.12], linewidth=4, solid_capstyle="butt",
                        color="#111" if i < cell.filled else "#fff")
            label = f"{cell.block_id}  {cell.filled}/{size}\n{','.join(cell.owners)}\nref {cell.ref_cnt}"
        else:
            label = f"{cell.block_id}\n" + ("null" if cell.state == "null" else f"free #{cell.free_position}")
        ax.text(x + 0.47, y + 0.58, label, ha="center", va="center", fontsize=6,
                color="#333" if cell.state == "free" else "white")
    ax.set_xlim(-0.1, columns + 0.1)
    ax.set_ylim(-(num_rows - 1) * 1.2 - 0.1, 1.1)
    ax.set_axis_off()
    handles = [Patch(facecolor=color, label=req_id) for req_id, color in view.colors.items()]
    handles += [Patch(facecolor="white", edgecolor="#999", hatch="//", label="shared (owners listed)"),
                Patch(facecolor=FREE_COLOR, edgecolor="#999", label="free"),
                Patch(facecolor=NULL_COLOR, label="null")]
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    tables = "; ".join(f"{req_id}: {ids}" for req_id, ids in view.block_tables.items()) or "(none)"
    ax.set_title(
        f"step {view.step}   block tables: {tables}\nfree queue head->tail: {view.free_queue}   "
        f"slots (bars): dark = K/V written; {view.empty_slots()} of {view.allocated_slots()} allocated empty",
        fontsize=8,
        loc="left",
    )
    return ax


# ---------------------------------------------------------------------------------------------------- widget


def block_table_widget(recording: EngineRecording, columns: int = 16) -> Any:
    """A step slider (with a play button) over a recorded run; each step redraws the HTML view. Its
    `text(step)` is the step as plain text; without ipywidgets it returns that text view alone."""
    views = [block_table_view(s, recording.request_ids) for s in recording.snapshots]
    if not have_widgets():
        fallback = TextView(replay_text("the block-table widget", 0, len(views) - 1,
                                        lambda step: render_block_table_text(views[step])))
        fallback.views = views
        return fallback
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=0, min=0, max=len(views) - 1, description="step")
    play = widgets.Play(value=0, min=0, max=len(views) - 1, interval=700)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(render_block_table_html(views[0], columns))

    def show(change: dict) -> None:
        board.value = render_block_table_html(views[change["new"]], columns)

    slider.observe(show, names="value")
    box = view_box([widgets.HBox([play, slider]), board],
                   replay_text("the block-table widget", 0, len(views) - 1,
                               lambda step: render_block_table_text(views[step]), lambda: slider.value))
    box.views = views  # the plain data behind the widget, for tests and curious learners
    return box


def block_table_text(recording: EngineRecording) -> str:
    """Every step of a recorded run as text (what the widget replays), one block after the other."""
    return "\n\n".join(render_block_table_text(block_table_view(s, recording.request_ids))
                       for s in recording.snapshots)


__all__ = ["BlockCell", "BlockTableView", "block_table_text", "block_table_view", "block_table_widget",
           "plot_block_table", "render_block_table_html", "render_block_table_text", "slot_fill"]
