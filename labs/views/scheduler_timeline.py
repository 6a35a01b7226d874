"""The scheduler timeline: steps x requests as a Gantt chart, recorded from a real engine run.

Mirrors no single vllm/v1 file; it draws the decisions of `Scheduler.schedule()` in
vllm/v1/core/sched/scheduler.py (mini: mini/core/sched/scheduler.py): which requests run in each step,
how many tokens each computes (a prefill chunk or one decode token), who is preempted, who finishes,
and how much of the token budget (`max_num_batched_tokens`) the step uses.

- `record_timeline(llm, prompts, params, static_batch_size=None)` -> `SchedulerTimeline`: plain data.
  With `static_batch_size=B` the driver feeds the engine B requests at a time and adds the next B only
  when all of them have finished: static batching, run on the same real engine;
- `render_timeline_html(timeline, step)` / `plot_scheduler_timeline(timeline)`: HTML or matplotlib;
- `plot_batching_comparison(continuous, static)`: both Gantt charts and the wasted batch slots per step;
- `scheduler_timeline_widget(timeline)`: ipywidgets, a step slider over the chart.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labs.views.colors import request_colors
from labs.views.recording import traced_step

KIND_COLORS = {"prefill": "#4e79a7", "chunk": "#a0cbe8", "decode": "#59a14f"}
PREEMPT_COLOR = "#e15759"
WAITING_COLOR = "#dddddd"  # in the engine's waiting queue
HELD_COLOR = "#f1ce63"  # not given to the engine yet (static batching: waiting for the batch to end)
FINISH_COLOR = "#222222"


@dataclass(slots=True)
class TimelineStep:
    """What one engine step did, read from the scheduler output and the step's outputs."""

    step: int  # 1-based
    num_scheduled_tokens: dict[str, int]  # request id -> tokens computed this step (batch order)
    kinds: dict[str, str]  # request id -> "prefill" | "chunk" (a partial prefill) | "decode"
    num_computed_before: dict[str, int]  # request id -> tokens in the KV cache before this step
    preempted: list[str]  # preempted during this schedule() (their KV blocks were freed)
    finished: list[str]  # finished by this step's outputs
    running: list[str]  # running requests after the step (SchedulerStats.running_req_ids)
    waiting: list[str]  # waiting requests after the step (preempted ones are back here)
    not_submitted: list[str]  # requests the driver has not given to the engine yet (static batching)
    num_free_blocks: int  # free KV blocks after the step

    @property
    def tokens_used(self) -> int:
        return sum(self.num_scheduled_tokens.values())


@dataclass(slots=True)
class SchedulerTimeline:
    label: str
    request_ids: list[str]  # in the order they were given (fixes each request's colour and row)
    token_budget: int  # max_num_batched_tokens
    max_num_seqs: int
    num_gpu_blocks: int
    steps: list[TimelineStep] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def cell(self, req_id: str, step_index: int) -> str:
        """What `req_id` was at steps[step_index]: "prefill" / "chunk" / "decode" (it ran), "preempted",
        "waiting" (in the engine, not scheduled), "held" (not given to the engine yet: static batching),
        "done", or "" (not seen yet)."""
        step = self.steps[step_index]
        if req_id in step.num_scheduled_tokens:
            return step.kinds[req_id]
        if req_id in step.preempted:
            return "preempted"
        if req_id in step.waiting or req_id in step.running:
            return "waiting"
        if req_id in step.not_submitted:
            return "held"
        if any(req_id in s.finished for s in self.steps[: step_index + 1]):
            return "done"
        return ""

    def grid(self) -> list[list[str]]:
        """One row per request, one column per step: the `cell` kinds."""
        return [[self.cell(req_id, i) for i in range(len(self.steps))] for req_id in self.request_ids]

    def idle_slots(self) -> list[int]:
        """Per step: batch slots (max_num_seqs) that no request used."""
        return [self.max_num_seqs - len(step.num_scheduled_tokens) for step in self.steps]

    def wasted_slots(self) -> list[int]:
        """Per step: idle batch slots while a request was waiting for one (in the engine or the driver)."""
        return [
            min(idle, len(step.waiting) + len(step.not_submitted))
            for idle, step in zip(self.idle_slots(), self.steps, strict=False)
        ]

    def finish_step(self) -> dict[str, int]:
        """Request id -> the step whose outputs finished it."""
        return {req_id: step.step for step in self.steps for req_id in step.finished}


def _kind(num_computed_before: int, num_scheduled: int, partial: bool, num_prompt_tokens: int) -> str:
    """What one step did for one request, from its SchedulerOutput.

    "chunk": the step leaves part of the request's tokens for later (`partial_prefill_req_ids`). Otherwise
    it computes every token the request lacked: one token past the prompt is a "decode", anything else a
    "prefill" (a whole prompt, the last chunk of one, or a preempted request's recompute).
    """
    if partial:
        return "chunk"
    return "decode" if num_scheduled == 1 and num_computed_before >= num_prompt_tokens else "prefill"


def _computed_before(output: Any) -> dict[str, int]:
    """Request id -> tokens in its KV cache before the step (the SchedulerOutput carries the old count)."""
    before = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    before.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    return before


def _timeline_step(
    output: Any, prompt_lens: dict[str, int], step_index: int, outputs: Sequence[Any], stats: Any,
    not_submitted: list[str],
) -> TimelineStep:
    """One step from its SchedulerOutput, the step's RequestOutputs and the PoolSnapshot after it."""
    for new in output.scheduled_new_reqs:  # every request is sent in full the first time it runs
        prompt_lens[new.req_id] = len(new.prompt_token_ids)
    before = _computed_before(output)
    kinds = {
        req_id: _kind(before[req_id], num_scheduled, req_id in output.partial_prefill_req_ids, prompt_lens[req_id])
        for req_id, num_scheduled in output.num_scheduled_tokens.items()
    }
    return TimelineStep(
        step=step_index,
        num_scheduled_tokens=dict(output.num_scheduled_tokens),
        kinds=kinds,
        num_computed_before={req_id: before[req_id] for req_id in output.num_scheduled_tokens},
        preempted=sorted(output.preempted_req_ids),
        finished=[out.request_id for out in outputs if out.finished],
        running=list(stats.running_req_ids),
        waiting=list(stats.waiting_req_ids),
        not_submitted=not_submitted,
        num_free_blocks=len(stats.free_block_ids),
    )


def record_timeline(
    llm: Any,
    prompts: Sequence[Any],
    params: Any,
    static_batch_size: int | None = None,
    label: str | None = None,
    max_steps: int = 500,
    on_step: Callable[[Any, TimelineStep], None] | None = None,
) -> SchedulerTimeline:
    """Add `prompts` as requests r0, r1, ... and step the engine to the end, recording every schedule().

    `params` is one SamplingParams or one per prompt. Continuous batching (default): every request is
    added up front and the scheduler admits them as room appears. `static_batch_size=B`: B requests at a
    time, the next B only once the engine is empty. `on_step(engine, step)` runs after each recorded
    step (tests compare the record with the engine there).

    Each step is read from its `StepTrace` (a step observer, `traced_step`): what `schedule()` decided, and
    the pool snapshot right after the step (who runs and waits, the free blocks).
    """
    engine = llm.llm_engine
    scheduler = engine.scheduler
    request_ids = [f"r{index}" for index in range(len(prompts))]
    params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    pending = list(zip(request_ids, prompts, params_list, strict=False))
    batch_size = len(pending) if static_batch_size is None else static_batch_size
    timeline = SchedulerTimeline(
        label=label
        or (
            "continuous batching"
            if static_batch_size is None
            else f"static batching (batches of {static_batch_size})"
        ),
        request_ids=request_ids,
        token_budget=scheduler.max_num_scheduled_tokens,
        max_num_seqs=scheduler.max_num_running_reqs,
        num_gpu_blocks=engine.snapshot_pool().num_gpu_blocks,
    )
    prompt_lens: dict[str, int] = {}
    for step_index in range(1, max_steps + 1):
        if not engine.has_unfinished_requests():
            if not pending:
                break
            for req_id, prompt, request_params in pending[:batch_size]:
                engine.add_request(req_id, prompt, request_params)
            pending = pending[batch_size:]
        outputs, trace = traced_step(engine)
        if trace is None:  # nothing was scheduled (only finished outputs were handed out)
            continue
        step = _timeline_step(trace.scheduler_output, prompt_lens, step_index, outputs, trace.snapshot(),
                              not_submitted=[req_id for req_id, _, _ in pending])
        timeline.steps.append(step)
        if on_step is not None:
            on_step(engine, step)
    return timeline


# ---------------------------------------------------------------------------------------- rendering
def _cell_style(kind: str) -> tuple[str, str]:
    if kind in KIND_COLORS:
        return KIND_COLORS[kind], "#fff" if kind != "chunk" else "#123"
    if kind == "preempted":
        return PREEMPT_COLOR, "#fff"
    if kind in ("waiting", "held"):
        return (WAITING_COLOR if kind == "waiting" else HELD_COLOR), "#999"
    return "#fff", "#ccc"


def _legend_text_color(kind: str) -> str:
    return "#333" if kind in ("waiting", "held") else "#fff"


def _budget_color(step: TimelineStep, timeline: SchedulerTimeline) -> str:
    return "#c00" if step.tokens_used == timeline.token_budget else "#333"


def render_timeline_html(timeline: SchedulerTimeline, step: int | None = None) -> str:
    """The Gantt chart as an HTML table; `step` (0-based) highlights one column and describes it."""
    colors = request_colors(timeline.request_ids)
    header = "".join(
        f"<th style='font-weight:{'bold' if i == step else 'normal'};padding:0 2px'>{s.step}</th>"
        for i, s in enumerate(timeline.steps)
    )
    rows = []
    for req_id in timeline.request_ids:
        cells = []
        for i, s in enumerate(timeline.steps):
            kind = timeline.cell(req_id, i)
            background, color = _cell_style(kind)
            text = (
                str(s.num_scheduled_tokens[req_id])
                if req_id in s.num_scheduled_tokens
                else ("P" if kind == "preempted" else "")
            )
            if req_id in s.finished:
                text += "&#10003;"
            border = "2px solid #000" if i == step else "1px solid #ddd"
            cells.append(
                f"<td title='{req_id} step {s.step}: {kind}' style='background:{background};color:{color};"
                f"border:{border};width:22px;text-align:center;font:10px monospace'>{text}</td>"
            )
        rows.append(
            f"<tr><td style='color:{colors[req_id]}'><b>{html.escape(req_id)}</b></td>{''.join(cells)}</tr>"
        )
    used = "".join(
        f"<td style='text-align:center;font:10px monospace;color:{_budget_color(s, timeline)}'>"
        f"{s.tokens_used}</td>"
        for s in timeline.steps
    )
    rows.append(f"<tr><td><i>tokens</i></td>{used}</tr>")
    legend = " ".join(
        f"<span style='background:{c};color:{_legend_text_color(k)};padding:0 4px'>{k}</span>"
        for k, c in [
            *KIND_COLORS.items(),
            ("preempted", PREEMPT_COLOR),
            ("waiting", WAITING_COLOR),
            ("held", HELD_COLOR),
        ]
    )
    detail = ""
    if step is not None and 0 <= step < len(timeline.steps):
        s = timeline.steps[step]
        detail = (
            f"<div><b>step {s.step}</b>: scheduled {s.num_scheduled_tokens} ({s.tokens_used}/"
            f"{timeline.token_budget} tokens); preempted {s.preempted}; finished {s.finished}; "
            f"running {s.running}; waiting {s.waiting}; held by the driver {s.not_submitted}; "
            f"free blocks {s.num_free_blocks}</div>"
        )
    return (
        f"<div style='font-family:sans-serif'><b>{html.escape(timeline.label)}</b>: "
        f"{len(timeline.steps)} steps, "
        f"budget {timeline.token_budget} tokens/step, max_num_seqs {timeline.max_num_seqs}. {legend} "
        f"(number = tokens computed, &#10003; = finished)<table style='border-collapse:collapse'>"
        f"<tr><th>step</th>{header}</tr>{''.join(rows)}</table>{detail}</div>"
    )


def _draw_gantt(gantt: Any, timeline: SchedulerTimeline) -> None:
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator

    num_rows = len(timeline.request_ids)
    for row, req_id in enumerate(timeline.request_ids):
        y = num_rows - 1 - row
        for i, step in enumerate(timeline.steps):
            kind = timeline.cell(req_id, i)
            if kind in KIND_COLORS or kind == "preempted":
                gantt.add_patch(
                    Rectangle(
                        (step.step - 0.5, y - 0.4),
                        0.95,
                        0.8,
                        facecolor=KIND_COLORS.get(kind, PREEMPT_COLOR),
                        edgecolor="white",
                    )
                )
            elif kind in ("waiting", "held"):
                color = WAITING_COLOR if kind == "waiting" else HELD_COLOR
                gantt.add_patch(Rectangle((step.step - 0.5, y - 0.1), 0.95, 0.2, facecolor=color))
            num_tokens = step.num_scheduled_tokens.get(req_id, 0)
            if num_tokens > 1:
                gantt.text(
                    step.step,
                    y,
                    str(num_tokens),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if kind == "prefill" else "#123",
                )
            if kind == "preempted":
                gantt.text(step.step, y, "P", ha="center", va="center", fontsize=7, color="white")
            if req_id in step.finished:
                gantt.plot(step.step + 0.45, y, marker="|", markersize=14, color=FINISH_COLOR)
    gantt.set_yticks(range(num_rows), list(reversed(timeline.request_ids)))
    gantt.set_ylim(-0.6, num_rows - 0.4)
    gantt.set_xlim(0.3, max(len(timeline.steps), 1) + 0.7)
    gantt.set_title(f"{timeline.label}: {len(timeline.steps)} steps", fontsize=9, loc="left")
    gantt.legend(
        handles=[Patch(color=c, label=k) for k, c in KIND_COLORS.items()]
        + [Patch(color=PREEMPT_COLOR, label="preempted"), Patch(color=WAITING_COLOR, label="waiting")]
        + [Patch(color=HELD_COLOR, label="held by the driver")]
        * any(s.not_submitted for s in timeline.steps),
        fontsize=7,
        loc="upper right",
        ncol=6,
    )
    gantt.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_scheduler_timeline(timeline: SchedulerTimeline) -> Any:
    """Static Gantt chart (top) and the tokens used per step against the budget (bottom); returns the Axes."""
    import matplotlib.pyplot as plt

    num_rows = len(timeline.request_ids)
    _, (gantt, budget) = plt.subplots(
        2,
        1,
        figsize=(max(6.0, 0.32 * len(timeline.steps) + 2), 0.4 * num_rows + 3),
        gridspec_kw={"height_ratios": [max(num_rows, 1), 3]},
        sharex=True,
    )
    _draw_gantt(gantt, timeline)
    steps = [s.step for s in timeline.steps]
    budget.bar(steps, [s.tokens_used for s in timeline.steps], color="#9c755f", width=0.8)
    budget.axhline(
        timeline.token_budget,
        color="#c00",
        linestyle="--",
        linewidth=1,
        label=f"max_num_batched_tokens = {timeline.token_budget}",
    )
    budget.set_ylabel("tokens / step", fontsize=8)
    budget.set_xlabel("engine step", fontsize=8)
    budget.legend(fontsize=7, loc="upper right")
    return gantt, budget


def plot_batching_comparison(continuous: SchedulerTimeline, static: SchedulerTimeline) -> Any:
    """Both Gantt charts on one step axis, and the wasted batch slots of each run per step."""
    import matplotlib.pyplot as plt

    num_rows = len(continuous.request_ids)
    num_steps = max(len(static.steps), len(continuous.steps))
    figure, axes = plt.subplots(
        3,
        1,
        figsize=(max(7.0, 0.3 * num_steps + 2), 0.45 * num_rows * 2 + 2.5),
        gridspec_kw={"height_ratios": [num_rows, num_rows, 3]},
        sharex=True,
    )
    for ax, timeline in zip(axes[:2], (continuous, static), strict=False):
        _draw_gantt(ax, timeline)
    for timeline in (continuous, static):
        wasted = timeline.wasted_slots()
        axes[2].step(
            [s.step for s in timeline.steps],
            wasted,
            where="mid",
            label=f"{timeline.label}: {sum(wasted)} wasted slot-steps",
        )
    axes[2].set_ylabel("wasted slots", fontsize=8)
    axes[2].set_xlabel("engine step", fontsize=8)
    axes[2].legend(fontsize=7, loc="upper right")
    axes[2].set_xlim(0.3, num_steps + 0.7)
    figure.tight_layout()
    return axes


def scheduler_timeline_widget(timeline: SchedulerTimeline) -> Any:
    """A step slider (with a play button) over the Gantt chart; the chosen step is described below it.
    `text(k)` is step index k as plain text (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, html_to_text, replay_text, view_box

    last = max(len(timeline.steps) - 1, 0)

    def page(index: int) -> str:
        return html_to_text(render_timeline_html(timeline, index))

    title = "the scheduler-timeline widget (step index)"
    if not have_widgets():
        fallback = TextView(replay_text(title, 0, last, page))
        fallback.timeline = timeline
        return fallback
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=0, min=0, max=last, description="step index")
    play = widgets.Play(value=0, min=0, max=last, interval=700)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(render_timeline_html(timeline, 0))

    def show(change: dict) -> None:
        board.value = render_timeline_html(timeline, change["new"])

    slider.observe(show, names="value")
    box = view_box([widgets.HBox([play, slider]), board], replay_text(title, 0, last, page, lambda: slider.value))
    box.timeline = timeline  # the plain data behind the widget
    return box
