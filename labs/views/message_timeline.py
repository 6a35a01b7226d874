"""Mirrors vllm/v1/engine/core_client.py, core.py and vllm/v1/executor/multiproc_executor.py: one request's
messages across the front end, the engine core and the workers, step by step, from REAL recorded events.

The events come from mini's opt-in recorder (mini/metrics/message_trace.py): build the engine inside
`message_trace.tracing()` and every process appends what it sends and receives (the front end's ADD on the
input socket, the core's `execute_model` broadcast to the workers, each worker's reply, the core's OUTPUTS
on the output socket, ...). `timeline_from_events(events, request_id=...)` cuts them into segments: the
admission (the request crossing to the core), then one segment per engine step (from the core's broadcast,
or its step when there are no workers, to the front end receiving the step's outputs).
`message_timeline_widget(timeline)` replays them with a slider: one column per process, one row per message,
time in milliseconds from the segment's first message; `render_timeline_text` is its text twin.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from labs.views.text_view import TextView, have_widgets, replay_text, view_box

# The messages a timeline shows (start-up calls such as initialize_cache are left out).
SHOWN = {"ADD", "ABORT", "UTILITY", "OUTPUTS", "execute_model", "replies", "reply", "step"}


@dataclass(slots=True)
class MessageTimeline:
    """The recorded messages cut into segments: `segments[0]` the admission, then one per step."""

    lanes: list[str]
    segments: list[list[dict[str, Any]]] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    request_id: str | None = None


def _lane_order(name: str) -> tuple[int, int]:
    if name == "front end":
        return (0, 0)
    if name == "engine core":
        return (1, 0)
    if name.startswith("worker "):
        return (2, int(name.split()[1]))
    return (3, 0)


def timeline_from_events(events: list[dict[str, Any]], request_id: str | None = None) -> MessageTimeline:
    """Segments of `events` (from `message_trace.read`); with `request_id`, only those that carry it."""
    shown = [event for event in events if event.get("message") in SHOWN]
    shown.sort(key=lambda event: event["t"])
    has_workers = any(event["process"].startswith("worker") for event in shown)
    segments: list[list[dict[str, Any]]] = [[]]
    last_step = None   # the segment holding the latest engine step: its OUTPUTS belong there
    for event in shown:
        core = event["process"] == "engine core"
        if has_workers:
            starts = core and event["direction"] == "send" and event["message"] == "execute_model"
        else:
            starts = core and event["message"] == "step"
        if starts and segments[-1]:
            segments.append([])
        if event["message"] == "step":
            last_step = len(segments) - 1
        if event["message"] == "OUTPUTS" and last_step is not None:
            segments[last_step].append(event)
        else:
            segments[-1].append(event)
    segments = [sorted(s, key=lambda event: event["t"]) for s in segments if s]

    def is_step(event: dict[str, Any]) -> bool:
        return event["process"] == "engine core" and event["message"] in ("execute_model", "step")

    if request_id is not None:   # this request's segments; other requests' messages left out
        mine = []
        for segment in segments:
            own = [e for e in segment if request_id in e.get("request_ids", ())]
            if not own:
                continue
            stepped = any(is_step(e) for e in own)
            mine.append([e for e in segment if e in own or (stepped and not e.get("request_ids"))])
        segments = mine
    titles = []
    step = 0
    for segment in segments:
        if any(is_step(e) for e in segment):
            titles.append(f"step {step}")
            step += 1
        else:
            titles.append("admission")
    lanes = sorted({e["process"] for s in segments for e in s}, key=_lane_order)
    return MessageTimeline(lanes=lanes, segments=segments, titles=titles, request_id=request_id)


def _describe(event: dict[str, Any]) -> str:
    arrow = {"send": "->", "recv": "<-", "step": "**"}.get(event["direction"], event["direction"])
    text = f"{arrow} {event['direction']} {event['message']}" if event["direction"] != "step" else "** step()"
    if event.get("nbytes") is not None:
        text += f" ({event['nbytes']} B)"
    if event.get("to"):
        text += f" to {event['to']} workers"
    ids = event.get("request_ids")
    if ids:
        text += f" [{', '.join(map(str, ids))}]"
    return text


def _rows(timeline: MessageTimeline, index: int) -> list[tuple[float, str, str]]:
    segment = timeline.segments[index]
    start = segment[0]["t"]
    return [((event["t"] - start) * 1000.0, event["process"], _describe(event)) for event in segment]


def render_timeline_text(timeline: MessageTimeline, index: int) -> str:
    """One segment as text: time, process, message."""
    lines = [f"{timeline.titles[index]}"
             + (f" of request {timeline.request_id}" if timeline.request_id is not None else "")]
    width = max((len(lane) for lane in timeline.lanes), default=10)
    for ms, process, text in _rows(timeline, index):
        lines.append(f"  {ms:7.2f} ms  {process:<{width}}  {text}")
    return "\n".join(lines)


def render_timeline_html(timeline: MessageTimeline, index: int) -> str:
    """One segment as an HTML table: a column per process, a row per message."""
    colors = {"front end": "#e3f2fd", "engine core": "#fff3e0"}
    head = "".join(f"<th style='padding:2px 8px'>{html.escape(lane)}</th>" for lane in timeline.lanes)
    body = []
    for ms, process, text in _rows(timeline, index):
        cells = []
        for lane in timeline.lanes:
            if lane == process:
                color = colors.get(lane, "#e8f5e9")
                cells.append(f"<td style='background:{color};padding:2px 8px;font-family:monospace'>"
                             f"{html.escape(text)}</td>")
            else:
                cells.append("<td></td>")
        body.append(f"<tr><td style='text-align:right;padding:2px 8px'>{ms:.2f} ms</td>{''.join(cells)}</tr>")
    title = html.escape(timeline.titles[index])
    return (f"<b>{title}</b><table style='border-collapse:collapse'><tr><th>time</th>{head}</tr>"
            f"{''.join(body)}</table>")


def message_timeline_widget(timeline: MessageTimeline) -> Any:
    """A slider over the segments (admission, step 0, step 1, ...) and the table of the one shown."""
    if not timeline.segments:
        raise ValueError("the recording has no engine messages: build the engine INSIDE message_trace.tracing()")
    last = len(timeline.segments) - 1
    if not have_widgets():
        return TextView(replay_text("the message timeline", 0, last,
                                    lambda i: render_timeline_text(timeline, i)))
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=0, min=0, max=last, description="segment")
    board = widgets.HTML(render_timeline_html(timeline, 0))

    def show(change: dict[str, Any]) -> None:
        board.value = render_timeline_html(timeline, change["new"])

    slider.observe(show, names="value")
    return view_box([slider, board], replay_text("the message timeline", 0, last,
                                                 lambda i: render_timeline_text(timeline, i),
                                                 current=lambda: slider.value))


__all__ = ["MessageTimeline", "message_timeline_widget", "render_timeline_html", "render_timeline_text",
           "timeline_from_events"]
