"""An opt-in recorder of the messages between the front end, the engine core and the workers.

Each process that sends or receives an engine message (the front end's client, mini/engine/core_client.py;
the engine core's socket threads and busy loop, core_proc.py; the tensor-parallel executor and its workers,
mini/executor/multiproc_executor.py) calls `record(...)` there, guarded by the module flag `ON`:

    if message_trace.ON:
        message_trace.record("engine core", "recv", "ADD", nbytes=len(data), request_ids=[...])

Off by default: `ON` is False and a hook costs one attribute read. `tracing()` turns it on: it picks a
file, sets `MINI_MESSAGE_TRACE` (so processes spawned later turn it on when they import this module; forked
ones inherit the flag) and every process appends one JSON line per event to that file (`O_APPEND` writes of
one short line do not interleave). `read(path)` returns the events in time order; the course's timeline view
(labs/views/message_timeline.py) draws them.

vLLM has no such recorder: its messages are traced with the torch profiler or OpenTelemetry spans
(vllm/tracing/otel.py). mini's is a teaching aid, and the one place the course reads the real messages from.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

ENV_TRACE = "MINI_MESSAGE_TRACE"

_PATH: str | None = os.environ.get(ENV_TRACE) or None
ON: bool = _PATH is not None
_LOCK = threading.Lock()


def record(process: str, direction: str, message: str, **detail: Any) -> None:
    """Append one event: which process (`"front end"`, `"engine core"`, `"worker 0"`...), `direction`
    (`"send"`, `"recv"`, `"step"`...), the message kind, and small details (request ids, bytes, step)."""
    path = _PATH
    if path is None:
        return
    event = {"t": time.time(), "pid": os.getpid(), "process": process, "direction": direction,
             "message": message, **detail}
    line = json.dumps(event, default=str) + "\n"
    with _LOCK:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def start(path: str | os.PathLike) -> str:
    """Record into `path` from now on, in this process and in processes started after this."""
    global _PATH, ON
    _PATH = os.fspath(path)
    ON = True
    os.environ[ENV_TRACE] = _PATH
    return _PATH


def stop() -> None:
    """Stop recording in this process (and in processes started after this)."""
    global _PATH, ON
    _PATH, ON = None, False
    os.environ.pop(ENV_TRACE, None)


def read(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every event recorded into `path`, in time order."""
    try:
        with open(path) as file:
            events = [json.loads(line) for line in file if line.strip()]
    except FileNotFoundError:
        return []
    return sorted(events, key=lambda event: event["t"])


@contextlib.contextmanager
def tracing(path: str | os.PathLike | None = None) -> Iterator[str]:
    """Record inside the `with` block; yields the file (a new temporary one unless `path`); the previous
    state comes back afterwards. Build the engine INSIDE the block so its processes record too."""
    previous = _PATH
    if path is None:
        fd, path = tempfile.mkstemp(prefix="mini-message-trace-", suffix=".jsonl")
        os.close(fd)
    start(path)
    try:
        yield os.fspath(path)
    finally:
        if previous is None:
            stop()
        else:
            start(previous)


def request_ids_of(payload: Any) -> list[str]:
    """The request ids a message carries (an EngineCoreRequest, EngineCoreOutputs, an abort's list)."""
    if hasattr(payload, "request_id"):
        return [str(payload.request_id)]
    outputs = getattr(payload, "outputs", None)
    if isinstance(outputs, list):
        return [str(getattr(output, "request_id", "")) for output in outputs]
    if isinstance(payload, (list, tuple)) and payload and isinstance(payload[0], (list, tuple)):
        return [str(request_id) for request_id in payload[0]]
    return []


__all__ = ["ENV_TRACE", "ON", "read", "record", "request_ids_of", "start", "stop", "tracing"]
