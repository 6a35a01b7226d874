"""The message timeline (labs/views/message_timeline.py): recorded events cut into the admission and one
segment per engine step, per request, drawn as a widget with a text twin; and a real recording of a TP=2
engine (front end, engine-core process, two workers) through mini/metrics/message_trace.py."""

from __future__ import annotations

import sys

import pytest

from labs.views.message_timeline import (
    message_timeline_widget,
    render_timeline_html,
    render_timeline_text,
    timeline_from_events,
)
from labs.views.text_view import TEXT_VIEW_PREFIX, TextView


def event(t, process, direction, message, **detail):
    return {"t": t, "pid": 1, "process": process, "direction": direction, "message": message, **detail}


def tp2_events():
    """Two steps of request "a" on two workers, a start-up call, and request "b" admitted later."""
    events = [event(0.0, "engine core", "send", "initialize_cache", to=2),
              event(1.0, "front end", "send", "ADD", nbytes=600, request_ids=["a"]),
              event(1.1, "engine core", "recv", "ADD", nbytes=600, request_ids=["a"])]
    for start in (2.0, 3.0):
        events += [event(start, "engine core", "send", "execute_model", nbytes=900, to=2, request_ids=["a"]),
                   event(start + 0.1, "worker 1", "recv", "execute_model"),
                   event(start + 0.11, "worker 0", "recv", "execute_model"),
                   event(start + 0.5, "worker 0", "send", "reply"),
                   event(start + 0.51, "worker 1", "send", "reply"),
                   event(start + 0.6, "engine core", "recv", "replies"),
                   event(start + 0.61, "engine core", "step", "step", request_ids=["a"]),
                   event(start + 0.62, "engine core", "send", "OUTPUTS", nbytes=500, request_ids=["a"])]
        # the front end reads step 0's outputs only after the core broadcast step 1
        events.append(event(start + 1.05, "front end", "recv", "OUTPUTS", nbytes=500, request_ids=["a"]))
    events += [event(5.0, "front end", "send", "ADD", request_ids=["b"])]
    return events


def test_segments_are_the_admission_then_one_per_step_with_their_outputs():
    timeline = timeline_from_events(tp2_events(), request_id="a")
    assert timeline.titles == ["admission", "step 0", "step 1"]
    assert timeline.lanes == ["front end", "engine core", "worker 0", "worker 1"]
    assert [e["message"] for e in timeline.segments[0]] == ["ADD", "ADD"]   # start-up calls are left out
    step0 = timeline.segments[1]
    assert step0[0]["message"] == "execute_model" and (step0[-1]["process"], step0[-1]["t"]) == ("front end", 3.05)
    assert [e["t"] for e in step0] == sorted(e["t"] for e in step0)
    assert sum(e["message"] == "OUTPUTS" for e in step0) == 2   # the core's send and the front end's late recv
    assert all(e["t"] >= 3.0 for e in timeline.segments[2])


def test_a_request_sees_only_its_own_segments():
    only_b = timeline_from_events(tp2_events(), request_id="b")
    assert only_b.titles == ["admission"] and [e["t"] for e in only_b.segments[0]] == [5.0]
    everything = timeline_from_events(tp2_events())
    assert everything.titles == ["admission", "step 0", "step 1"] and everything.segments[2][-1]["t"] == 5.0
    assert timeline_from_events(tp2_events(), request_id="nobody").segments == []


def test_without_workers_a_step_starts_at_the_core_step():
    events = [event(0.0, "front end", "send", "ADD", request_ids=["a"]),
              event(0.1, "engine core", "recv", "ADD", request_ids=["a"]),
              event(0.2, "engine core", "step", "step", request_ids=["a"]),
              event(0.3, "engine core", "send", "OUTPUTS", request_ids=["a"]),
              event(0.4, "engine core", "step", "step", request_ids=["a"]),
              event(0.45, "front end", "recv", "OUTPUTS", request_ids=["a"]),
              event(0.5, "engine core", "send", "OUTPUTS", request_ids=["a"])]
    timeline = timeline_from_events(events, request_id="a")
    assert timeline.titles == ["admission", "step 0", "step 1"]
    assert [e["t"] for e in timeline.segments[1]] == [0.2, 0.3]


def test_the_text_and_the_html_show_every_message_with_its_time():
    timeline = timeline_from_events(tp2_events(), request_id="a")
    text = render_timeline_text(timeline, 1)
    assert text.splitlines()[0] == "step 0 of request a"
    assert "-> send execute_model (900 B) to 2 workers [a]" in text and "worker 1" in text
    assert "   0.00 ms  engine core" in text and "** step() [a]" in text
    html = render_timeline_html(timeline, 1)
    assert html.count("<tr>") == len(timeline.segments[1]) + 1 and "worker 0" in html


def test_the_widget_and_its_text_twin(monkeypatch):
    timeline = timeline_from_events(tp2_events(), request_id="a")
    widget = message_timeline_widget(timeline)
    assert widget.text().startswith(TEXT_VIEW_PREFIX + "the message timeline")
    assert "admission" in widget.text() and "step 1" in widget.text(2)
    widget.children[0].value = 2
    assert "(step 2 of 0..2)" in widget.text() and "<b>step 1</b>" in widget.children[1].value
    assert "send ADD [b]" not in widget.text()
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    view = message_timeline_widget(timeline)
    assert isinstance(view, TextView) and repr(view).startswith(TEXT_VIEW_PREFIX)
    with pytest.raises(ValueError, match="no engine messages"):
        message_timeline_widget(timeline_from_events([], request_id="a"))


def test_a_real_tp2_engine_records_every_process(tmp_path, monkeypatch):
    from mini import LLM, SamplingParams
    from mini.metrics import message_trace

    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    with message_trace.tracing(tmp_path / "trace.jsonl") as path:
        llm = LLM(tensor_parallel_size=2, num_gpu_blocks_override=32, max_model_len=64, max_num_seqs=2)
        try:
            output = llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=2),
                                  use_tqdm=False)[0]
        finally:
            llm.llm_engine.shutdown()
    assert not message_trace.ON
    events = message_trace.read(path)
    timeline = timeline_from_events(events, request_id=output.request_id)
    assert timeline.lanes == ["front end", "engine core", "worker 0", "worker 1"]
    assert timeline.titles == ["admission", "step 0", "step 1"]
    assert len({e["pid"] for e in events}) == 4   # four processes wrote to the file
    for segment in timeline.segments[1:]:
        kinds = {(e["process"], e["direction"], e["message"]) for e in segment}
        assert {("engine core", "send", "execute_model"), ("worker 0", "recv", "execute_model"),
                ("worker 1", "send", "reply"), ("engine core", "step", "step"),
                ("front end", "recv", "OUTPUTS")} <= kinds
