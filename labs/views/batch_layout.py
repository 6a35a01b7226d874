"""Mirrors no single vllm/v1 file: the batch-layout view, one step's flat tensors linked to the blocks.

It draws what `GPUModelRunner._prepare_inputs` in
vllm/v1/worker/gpu_model_runner.py builds (mini: mini/worker/prepare_inputs.py): `input_ids`,
`positions`, `slot_mapping` (with each slot's block and offset), `query_start_loc` and `seq_lens`.

- `batch_layout(...)` / `batch_layout_from_inputs(...)` -> `BatchLayout`: plain data (unit-tested);
- `render_batch_layout_html(layout)` / `plot_batch_layout(layout)`: HTML or static matplotlib;
- `batch_layout_widget(recording)`: ipywidgets, a step slider over the batches of a recorded run.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labs.views.colors import request_colors
from labs.views.recording import BatchInputs, EngineRecording


@dataclass(slots=True)
class TokenColumn:
    """One flat row of the batch (one token being computed this step)."""

    row: int
    req_id: str
    input_id: int
    position: int
    slot: int
    block_id: int  # slot // block_size
    offset: int  # slot % block_size
    color: str


@dataclass(slots=True)
class BatchLayout:
    block_size: int
    req_ids: list[str]
    columns: list[TokenColumn]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]
    colors: dict[str, str]

    def written_slots(self) -> dict[int, list[int]]:
        """Block id -> offsets written this step (what the view links the tokens to)."""
        result: dict[int, list[int]] = {}
        for column in self.columns:
            result.setdefault(column.block_id, []).append(column.offset)
        return result


def batch_layout_from_inputs(
    batch: BatchInputs, block_size: int, request_ids: Sequence[str] | None = None
) -> BatchLayout:
    colors = request_colors(list(request_ids) if request_ids is not None else batch.req_ids)
    columns = []
    for req_index, req_id in enumerate(batch.req_ids):
        start, end = batch.query_start_loc[req_index], batch.query_start_loc[req_index + 1]
        for row in range(start, end):
            slot = batch.slot_mapping[row]
            columns.append(
                TokenColumn(
                    row,
                    req_id,
                    batch.input_ids[row],
                    batch.positions[row],
                    slot,
                    slot // block_size,
                    slot % block_size,
                    colors.get(req_id, "#999"),
                )
            )
    return BatchLayout(
        block_size,
        list(batch.req_ids),
        columns,
        list(batch.query_start_loc),
        list(batch.seq_lens),
        [list(r) for r in batch.block_table],
        colors,
    )


def batch_layout(
    token_ids: Sequence[Sequence[int]],
    num_computed_tokens: Sequence[int],
    num_scheduled_tokens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    req_ids: Sequence[str] | None = None,
) -> BatchLayout:
    """The layout mini's `prepare_inputs` builds for these per-request lists."""
    from mini.worker import prepare_inputs as batch_inputs

    inputs = batch_inputs.prepare_inputs(
        token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size
    )
    names = list(req_ids) if req_ids is not None else [f"r{i}" for i in range(len(token_ids))]
    batch = BatchInputs(
        req_ids=names,
        **{
            key: inputs[key].tolist()
            for key in (
                "input_ids",
                "positions",
                "slot_mapping",
                "query_start_loc",
                "seq_lens",
                "block_table",
            )
        },
    )
    return batch_layout_from_inputs(batch, block_size, names)


def render_batch_layout_html(layout: BatchLayout) -> str:
    def row(label: str, values: list[Any]) -> str:
        cells = "".join(
            f'<td style="background:{c.color};color:white;padding:2px 5px;text-align:center">{v}</td>'
            for c, v in zip(layout.columns, values, strict=False)
        )
        return f"<tr><th style='text-align:right;padding-right:6px'>{label}</th>{cells}</tr>"

    cols = layout.columns
    table = "".join(
        [
            row("request", [html.escape(c.req_id) for c in cols]),
            row("flat row", [c.row for c in cols]),
            row("input_ids", [c.input_id for c in cols]),
            row("positions", [c.position for c in cols]),
            row("slot_mapping", [c.slot for c in cols]),
            row("= block", [c.block_id for c in cols]),
            row("+ offset", [c.offset for c in cols]),
        ]
    )
    per_request = "".join(
        f"<tr><td style='color:{layout.colors.get(r, '#999')}'><b>{html.escape(r)}</b></td>"
        f"<td>{layout.query_start_loc[i]}:{layout.query_start_loc[i + 1]}</td><td>{layout.seq_lens[i]}</td>"
        f"<td>{[b for b in layout.block_table[i] if b] or layout.block_table[i]}</td></tr>"
        for i, r in enumerate(layout.req_ids)
    )
    blocks = "".join(
        f"<span style='margin-right:10px'>block {b}: offsets {offs}</span>"
        for b, offs in sorted(layout.written_slots().items())
    )
    return (
        f"<div style='font-family:monospace;font-size:12px'><table style='border-collapse:collapse'>{table}"
        f"</table><div>query_start_loc = {layout.query_start_loc}; seq_lens = {layout.seq_lens}</div>"
        f"<table><tr><th>request</th><th>flat rows</th><th>seq_len</th><th>block table</th></tr>"
        f"{per_request}</table><div>KV slots written this step: {blocks}</div></div>"
    )


def plot_batch_layout(layout: BatchLayout, ax: Any = None) -> Any:
    """Static matplotlib drawing: the aligned rows, then the KV blocks with the written slots filled."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    labels = ["input_ids", "positions", "slot_mapping", "block", "offset"]
    width = max(len(layout.columns), 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * width + 1.6, 3.2))
    for x, c in enumerate(layout.columns):
        for y, value in enumerate([c.input_id, c.position, c.slot, c.block_id, c.offset]):
            ax.add_patch(Rectangle((x, -y), 0.95, 0.9, facecolor=c.color, alpha=0.85))
            ax.text(x + 0.47, -y + 0.45, str(value), ha="center", va="center", fontsize=7, color="white")
    for y, label in enumerate(labels):
        ax.text(-0.2, -y + 0.45, label, ha="right", va="center", fontsize=8)
    written = layout.written_slots()
    for index, block_id in enumerate(sorted(written)):  # the blocks these tokens write into
        x0, y0 = index * (layout.block_size + 0.6), -len(labels) - 1
        owner = next(c for c in layout.columns if c.block_id == block_id)
        for offset in range(layout.block_size):
            filled = offset in written[block_id]
            ax.add_patch(
                Rectangle(
                    (x0 + offset * 0.9, y0),
                    0.85,
                    0.8,
                    edgecolor="#666",
                    facecolor=owner.color if filled else "#f4f4f4",
                )
            )
        ax.text(x0, y0 - 0.35, f"block {block_id}", fontsize=7)
    ax.set_xlim(-2.2, max(width, len(written) * (layout.block_size + 0.6)) + 0.2)
    ax.set_ylim(-len(labels) - 1.6, 1.1)
    ax.set_axis_off()
    ax.set_title(
        f"query_start_loc={layout.query_start_loc}  seq_lens={layout.seq_lens}", fontsize=8, loc="left"
    )
    return ax


def batch_layout_widget(recording: EngineRecording) -> Any:
    """A step slider over the batches of a recorded run (steps that ran the model); `text(step)` is a step
    as plain text (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, html_to_text, replay_text, view_box

    steps = [s for s in recording.snapshots if s.batch is not None]
    if not steps:
        raise ValueError("the recording has no batch inputs: record it with labs.views.record_run")
    layouts = [batch_layout_from_inputs(s.batch, s.block_size, recording.request_ids) for s in steps]
    by_step = {s.step: layout for s, layout in zip(steps, layouts, strict=False)}

    def page(step: int) -> str:
        layout = by_step.get(step)
        return html_to_text(render_batch_layout_html(layout)) if layout else "(no model run at this step)"

    title = "the batch-layout widget"
    if not have_widgets():
        return TextView(replay_text(title, steps[0].step, steps[-1].step, page))
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=steps[0].step, min=steps[0].step, max=steps[-1].step, description="step")
    board = widgets.HTML(render_batch_layout_html(layouts[0]))

    def show(change: dict) -> None:
        layout = by_step.get(change["new"])
        board.value = render_batch_layout_html(layout) if layout else "(no model run at this step)"

    slider.observe(show, names="value")
    box = view_box([slider, board], replay_text(title, steps[0].step, steps[-1].step, page, lambda: slider.value))
    box.layouts = layouts
    return box
