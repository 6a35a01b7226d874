"""The opt-in message recorder (mini/metrics/message_trace.py): off by default and then a no-op, on inside
`tracing()` (also for processes started there, through the environment), restored afterwards."""

from __future__ import annotations

import json
import multiprocessing
import os

from mini.metrics import message_trace
from mini.serial_utils import EngineCoreOutputs


def _child_records() -> None:
    from mini.metrics import message_trace as trace

    trace.record("worker 0", "recv", "execute_model")


def test_off_by_default_and_recording_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.delenv(message_trace.ENV_TRACE, raising=False)
    assert not message_trace.ON
    message_trace.record("front end", "send", "ADD")   # nowhere to write: nothing happens
    assert message_trace.read(tmp_path / "absent.jsonl") == []


def test_tracing_records_here_and_in_forked_children_then_restores(tmp_path):
    path = tmp_path / "trace.jsonl"
    with message_trace.tracing(path) as written:
        assert message_trace.ON and os.environ[message_trace.ENV_TRACE] == written
        message_trace.record("front end", "send", "ADD", nbytes=10, request_ids=["a"])
        child = multiprocessing.get_context("fork").Process(target=_child_records)
        child.start()
        child.join(30)
        assert child.exitcode == 0
    assert not message_trace.ON and message_trace.ENV_TRACE not in os.environ
    message_trace.record("front end", "send", "ADD")   # after the block: not recorded
    events = message_trace.read(path)
    assert [(e["process"], e["message"]) for e in events] == [("front end", "ADD"), ("worker 0", "execute_model")]
    assert events[0]["request_ids"] == ["a"] and events[0]["nbytes"] == 10 and events[1]["pid"] == child.pid
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_temporary_file_by_default(monkeypatch):
    monkeypatch.delenv(message_trace.ENV_TRACE, raising=False)
    with message_trace.tracing() as path:
        message_trace.record("engine core", "step", "step")
    try:
        assert [e["message"] for e in message_trace.read(path)] == ["step"]
    finally:
        os.remove(path)


def test_request_ids_of_the_messages():
    from mini.engine import EngineCoreOutput

    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="a", new_token_ids=[1]),
                                         EngineCoreOutput(request_id="b", new_token_ids=[2])])
    assert message_trace.request_ids_of(outputs) == ["a", "b"]
    assert message_trace.request_ids_of((["x", "y"], "FINISHED_ABORTED")) == ["x", "y"]
    assert message_trace.request_ids_of((7, "ping", [])) == []
