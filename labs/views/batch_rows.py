"""The persistent batch's rows, step by step: how each BatchUpdate replaces, removes, condenses and swaps them.

Mirrors no single vllm/v1 file; it draws what vllm/v1/worker/gpu_input_batch.py (mini:
mini/worker/input_batch.py) tells the logits processors through a `BatchUpdate`
(vllm/v1/sample/logits_processor/interface.py), applied in the order removes -> adds -> moves.

- `record_batch_updates(llm, arrivals)`: step a real engine, replay each step's BatchUpdate (a step
  observer's `trace.batch_update`) and check it against the rows of `engine.model_runner.input_batch`;
- `record_input_batch(steps)`: the same from an `InputBatch` driven directly (finished / new / swaps);
- `recording_from_updates(rows, updates)`: hand-written BatchUpdates (e.g. with attention-backend swaps);
- `replay_batch_update(rows, update, added_ids)` -> `BatchRowsStep`: plain data (unit-tested), every
  intermediate stage (after the removes, after the adds, after each move) and the per-row events;
- `render_batch_rows_html(step)`, `plot_batch_rows(recording)`, `batch_rows_widget(recording)`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from labs.views.colors import FREE_COLOR, request_colors
from labs.views.recording import traced_step

Rows = list  # list[str | None]: the request id in each row, None = hole


@dataclass(slots=True)
class RowEvent:
    """What happened to one row in a step."""

    kind: (
        str  # "added" (into a new row), "replaced" (a finished request's row), "removed", "moved", "swapped"
    )
    row: int
    req_id: str | None
    from_row: int | None = None  # for "moved" / "swapped": the other row

    def describe(self) -> str:
        if self.kind == "moved":
            return f"{self.req_id} moved {self.from_row} -> {self.row} (condense)"
        if self.kind == "swapped":
            return f"{self.req_id} swapped {self.from_row} <-> {self.row}"
        if self.kind == "removed":
            return f"row {self.row} removed"
        return f"{self.req_id} {self.kind} at row {self.row}"


@dataclass(slots=True)
class BatchRowsStep:
    """One step: the rows before, each stage of applying the BatchUpdate, the rows after."""

    step: int
    before: Rows
    stages: list[tuple[str, Rows]]  # (label, rows) after removes, after adds, after each move
    events: list[RowEvent]
    removed: list[int]
    added: list[tuple[int, str]]  # (row, request id)
    moved: list[tuple[int, int, str]]  # (from, to, "UNIDIRECTIONAL" | "SWAP")
    changed: bool = True  # False: update_state(None)

    @property
    def after(self) -> Rows:
        return self.stages[-1][1] if self.stages else list(self.before)


@dataclass(slots=True)
class BatchRowsRecording:
    steps: list[BatchRowsStep]
    request_ids: list[str] = field(default_factory=list)  # fixes each request's colour

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def max_rows(self) -> int:
        widths = [len(rows) for s in self.steps for rows in [s.before] + [r for _, r in s.stages]]
        return max(widths, default=0)


def _trim(rows: Rows) -> Rows:
    rows = list(rows)
    while rows and rows[-1] is None:
        rows.pop()
    return rows


def replay_batch_update(
    rows: Sequence[str | None], update: Any, added_ids: Sequence[str], step: int = 0
) -> BatchRowsStep:
    """Apply `update` (a BatchUpdate or None) to `rows`, as a logits processor must: removes -> adds -> moves.

    `added_ids[i]` is the request id of `update.added[i]` (a BatchUpdate carries params, not ids).
    """
    before = _trim(rows)
    if update is None:
        return BatchRowsStep(step, before, [], [], [], [], [], changed=False)
    if len(added_ids) != len(update.added):
        raise ValueError(
            f"added_ids must name each added request: {len(update.added)} added, {len(added_ids)} ids given"
        )
    current: Rows = list(before)
    events: list[RowEvent] = []
    stages: list[tuple[str, Rows]] = []

    def grow(size: int) -> None:
        current.extend([None] * (size - len(current)))

    removed = sorted(update.removed)
    for row in removed:
        grow(row + 1)
        current[row] = None
        events.append(RowEvent("removed", row, before[row] if row < len(before) else None))
    stages.append((f"removes {removed}" if removed else "no removes", list(current)))

    added = []
    for (row, *_), req_id in zip(update.added, added_ids, strict=False):
        grow(row + 1)
        occupied = row < len(before) and before[row] is not None and row not in removed
        current[row] = req_id
        added.append((row, req_id))
        events.append(RowEvent("replaced" if occupied else "added", row, req_id))
    stages.append((f"adds {[r for r, _ in added]}" if added else "no adds", list(current)))

    moved = []
    for a, b, direction in update.moved:
        name = getattr(direction, "name", str(direction))
        grow(max(a, b) + 1)
        if name == "SWAP":
            current[a], current[b] = current[b], current[a]
            events.append(RowEvent("swapped", b, current[b], a))
            if current[a] is not None:
                events.append(RowEvent("swapped", a, current[a], b))
            label = f"swap {a} <-> {b}"
        else:
            current[b], current[a] = current[a], None
            events.append(RowEvent("moved", b, current[b], a))
            label = f"move {a} -> {b}"
        moved.append((a, b, name))
        stages.append((label, list(current)))
    stages = [(label, _trim(r)) for label, r in stages]
    if len(stages[-1][1]) != update.batch_size:
        raise ValueError(
            f"after the update the batch has {len(stages[-1][1])} rows, but batch_size is "
            f"{update.batch_size}: the update does not fit these rows"
        )
    return BatchRowsStep(step, before, stages, events, removed, added, moved)


# ---------------------------------------------------------------- recording
def recording_from_updates(
    rows: Sequence[str | None], updates: Sequence[tuple[Any, Sequence[str]]]
) -> BatchRowsRecording:
    """Replay hand-written `(BatchUpdate or None, added request ids)` pairs, starting from `rows`."""
    steps: list[BatchRowsStep] = []
    current = _trim(rows)
    request_ids = [r for r in current if r is not None]
    for index, (update, added_ids) in enumerate(updates):
        steps.append(replay_batch_update(current, update, added_ids, step=index))
        current = steps[-1].after
        request_ids += [r for r in added_ids if r not in request_ids]
    return BatchRowsRecording(steps, request_ids)


def _added_ids(update: Any, requests: Sequence[Any]) -> list[str]:
    """Request ids of the added entries, found by the identity of their live output lists."""
    by_output = {id(state.output_token_ids): state.req_id for state in requests if state is not None}
    return [by_output.get(id(output), "?") for *_, output in (update.added if update is not None else [])]


def _row_state(req_id: str, sampling_params: Any) -> Any:
    """A stand-in request state for a view's own InputBatch: only its id and its own output list matter
    (a BatchUpdate's added entries carry that list, which names the request: `_added_ids`)."""
    from mini.worker.input_batch import CachedRequestState

    return CachedRequestState(
        req_id=req_id,
        prompt_token_ids=[0],
        output_token_ids=[],
        sampling_params=sampling_params,
        generator=None,
        block_ids=[],
        num_computed_tokens=0,
    )


def record_batch_updates(
    llm: Any, arrivals: Sequence[tuple[int, Any, Any]], max_steps: int = 200
) -> BatchRowsRecording:
    """Step `llm`'s engine; `arrivals[i] = (step, prompt, params)` adds request "r{i}" before that step.

    Each step's BatchUpdate is the one the runner's persistent batch handed its logits processors
    (`trace.batch_update` of the step's `StepTrace`, see `traced_step`); the added rows are named by matching each added
    entry's live prompt list with the request states now in the batch.
    """
    engine = llm.llm_engine
    input_batch = engine.model_runner.input_batch
    request_ids = [f"r{index}" for index in range(len(arrivals))]
    steps: list[BatchRowsStep] = []
    rows: Rows = [state.req_id for state in input_batch.occupied_requests()]
    for step in range(max_steps):
        for (arrival, prompt, params), req_id in zip(arrivals, request_ids, strict=False):
            if arrival == step:
                engine.add_request(req_id, prompt, params)
        if not engine.has_unfinished_requests():
            if all(arrival <= step for arrival, *_ in arrivals):
                break
            continue
        _, trace = traced_step(engine, snapshot=False)
        if trace is None:  # nothing was scheduled: the runner did not run
            continue
        states = input_batch.occupied_requests()
        update = trace.batch_update
        by_prompt = {id(state.prompt_token_ids): state.req_id for state in states}
        added_ids = [by_prompt[id(prompt_ids)] for _, _, prompt_ids, _ in update.added] if update else []
        after = [state.req_id for state in states]
        replayed = replay_batch_update(rows, update, added_ids, step=step)
        if replayed.after != after:
            raise RuntimeError(
                f"step {step}: replaying the BatchUpdate gives rows {replayed.after}, "
                f"but the InputBatch holds {after}"
            )
        steps.append(replayed)
        rows = after
    return BatchRowsRecording(steps, request_ids)


def record_input_batch(
    steps: Sequence[tuple[Sequence[str], Sequence[str]]],
    swaps: Sequence[Sequence[tuple[int, int]]] | None = None,
    max_num_reqs: int = 64,
) -> BatchRowsRecording:
    """Drive a fresh `InputBatch`: per step, remove the finished ids, add the new ones, condense, then swap.

    `swaps[i]` lists row pairs to exchange after step i's condense (needs `InputBatch.swap_states`).
    """
    from mini.sampling_params import SamplingParams
    from mini.worker.input_batch import InputBatch

    batch = InputBatch(max_num_reqs=max_num_reqs)
    recorded: list[BatchRowsStep] = []
    rows: Rows = []
    request_ids: list[str] = []
    for index, (finished, new) in enumerate(steps):
        for req_id in finished:
            batch.remove_request(req_id)
        states = [_row_state(req_id, SamplingParams()) for req_id in new]
        request_ids += list(new)
        for state in states:
            batch.add_request(state)
        batch.condense()
        for a, b in swaps[index] if swaps is not None and index < len(swaps) else ():
            if not hasattr(batch, "swap_states"):
                raise ValueError("this InputBatch has no swap_states(a, b): swaps are not available")
            batch.swap_states(a, b)
        update = batch.get_batch_update()
        replayed = replay_batch_update(rows, update, _added_ids(update, states), step=index)
        if replayed.after != _trim(batch.req_ids):
            raise RuntimeError(
                f"step {index}: replay gives {replayed.after}, the InputBatch holds {batch.req_ids}"
            )
        recorded.append(replayed)
        rows = _trim(batch.req_ids)
    return BatchRowsRecording(recorded, request_ids)


# ---------------------------------------------------------------- rendering
_MARKS = {"added": "+", "replaced": "+", "moved": "\u2190", "swapped": "\u21c4"}


def render_batch_rows_html(step: BatchRowsStep, request_ids: Sequence[str] | None = None) -> str:
    """A table: one column per stage (before, removes, adds, each move), one line per row."""
    ids = (
        list(request_ids)
        if request_ids is not None
        else sorted(
            {r for rows in [step.before] + [s for _, s in step.stages] for r in rows if r is not None}
        )
    )
    colors = request_colors(ids)
    columns = [("before", step.before)] + step.stages
    height = max((len(rows) for _, rows in columns), default=0)

    def cell(rows: Rows, row: int) -> str:
        req_id = rows[row] if row < len(rows) else None
        if req_id is None:
            style = f"background:{FREE_COLOR};color:#999" if row < len(rows) else "color:#ccc"
            return f"<td style='{style};padding:2px 8px;text-align:center'>{'hole' if row < len(rows) else ''}</td>"
        return (
            f"<td style='background:{colors.get(req_id, '#999')};color:white;padding:2px 8px;"
            f"text-align:center'>{html.escape(req_id)}</td>"
        )

    header = "".join(f"<th style='padding:2px 8px'>{html.escape(label)}</th>" for label, _ in columns)
    body = "".join(
        f"<tr><th>row {row}</th>{''.join(cell(rows, row) for _, rows in columns)}</tr>"
        for row in range(height)
    )
    if not step.changed:
        summary = "update_state(None): the batch did not change"
    else:
        summary = (
            f"BatchUpdate: removed={step.removed} added={step.added} "
            f"moved={[(a, b, d) for a, b, d in step.moved]}"
        )
    events = "".join(f"<li>{html.escape(e.describe())}</li>" for e in step.events)
    return (
        f"<div style='font-family:monospace;font-size:12px'><div><b>step {step.step}</b> {html.escape(summary)}"
        f"</div><table style='border-collapse:collapse'><tr><th></th>{header}</tr>{body}</table>"
        f"<ul>{events}</ul></div>"
    )


def plot_batch_rows(recording: BatchRowsRecording, ax: Any = None) -> Any:
    """Rows (y) over steps (x), coloured by request; + added/replaced, \u2190 moved in, \u21c4 swapped."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colors = request_colors(recording.request_ids)
    steps = recording.steps
    height = max(recording.max_rows, 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.75 * len(steps) + 1.5, 0.45 * height + 1.2))
    for x, step in enumerate(steps):
        marks: dict[int, str] = {}
        for event in step.events:
            if event.kind in _MARKS:
                marks[event.row] = _MARKS[event.kind] + (str(event.from_row) if event.kind == "moved" else "")
        for row, req_id in enumerate(step.after):
            color = FREE_COLOR if req_id is None else colors.get(req_id, "#999")
            ax.add_patch(Rectangle((x, -row), 0.92, 0.88, facecolor=color, edgecolor="#666", linewidth=0.4))
            text = "" if req_id is None else f"{req_id}{marks.get(row, '')}"
            ax.text(x + 0.46, -row + 0.44, text, ha="center", va="center", fontsize=6, color="white")
        for row in step.removed:
            if row >= len(step.after):
                ax.text(x + 0.46, -row + 0.44, "\u00d7", ha="center", va="center", fontsize=8, color="#999")
    ax.set_xlim(-0.1, len(steps))
    ax.set_ylim(-height + 0.8, 1.0)
    ax.set_xticks([x + 0.46 for x in range(len(steps))], [str(s.step) for s in steps], fontsize=7)
    ax.set_yticks([-r + 0.44 for r in range(height)], [f"row {r}" for r in range(height)], fontsize=7)
    ax.set_xlabel("engine step", fontsize=8)
    ax.set_title(
        "persistent batch rows after each BatchUpdate (+ added/replaced, \u2190k moved from row k, "
        "\u21c4 swapped, \u00d7 row removed)",
        fontsize=8,
        loc="left",
    )
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return ax


def batch_rows_widget(recording: BatchRowsRecording) -> Any:
    """A step slider over the recording; each step shows its stages (render_batch_rows_html). `text(k)` is
    update k as plain text (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, html_to_text, replay_text, view_box

    if not recording.steps:
        raise ValueError("the recording has no steps")

    def page(index: int) -> str:
        return html_to_text(render_batch_rows_html(recording.steps[index], recording.request_ids))

    title, last = "the batch-rows widget (update #)", len(recording.steps) - 1
    if not have_widgets():
        return TextView(replay_text(title, 0, last, page))
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=0, min=0, max=len(recording.steps) - 1, description="update #")
    board = widgets.HTML(render_batch_rows_html(recording.steps[0], recording.request_ids))

    def show(change: dict) -> None:
        board.value = render_batch_rows_html(recording.steps[change["new"]], recording.request_ids)

    slider.observe(show, names="value")
    return view_box([slider, board], replay_text(title, 0, last, page, lambda: slider.value))
