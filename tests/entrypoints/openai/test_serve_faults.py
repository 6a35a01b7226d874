"""`python -m mini serve` ends cleanly on faults (issue 40), as vLLM's server (vllm/entrypoints/launchers/launcher.py).

  * SIGTERM at any moment of start-up (before the engine exists, while its core process starts, once serving)
    leaves no `mini-engine-*` socket folder and no engine-core process behind;
  * the engine core's death stops the server with exit status 1, so a supervisor restarts it
    (`--keep-alive-on-engine-death` keeps it up, answering 503);
  * the shutdown drain is bounded: `--shutdown-timeout 0` (vLLM's default) cuts an in-flight stream at once,
    a longer one lets it finish.

Each test runs the real command in a subprocess with its own TMPDIR, so the socket folders it creates are its
own to count. Waits are hang guards (tests/patience.py), never speed limits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.core_proc import PROCESS_NAME as CORE_PROCESS_NAME
from mini.entrypoints.openai.api_server import free_port

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MULTIPROCESS = os.environ.get("MINI_ENABLE_V1_MULTIPROCESSING", "1") != "0"
POLL_S = 0.02


def start_server(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    log = open(tmp_path / "server.log", "wb")   # noqa: SIM115  (closed with the process)
    process = subprocess.Popen([sys.executable, "-m", "mini", "serve", "--port", str(port), "--max-model-len", "1024",
                                "--log-level", "warning", *extra], env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def wait_until(condition, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited ({process.returncode}) before {what}")
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(POLL_S)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 200
    except httpx.TransportError:
        return False


def socket_folders(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("mini-engine-*"))


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def named(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:   # a short-lived helper (a compiler run at start-up) already gone
        return ""


def assert_gone(processes: list[psutil.Process]) -> None:
    for process in processes:
        wait_until(lambda p=process: gone(p), f"{process} gone")


@pytest.mark.parametrize("moment", ["at_once", "while_the_core_starts", "serving"])
def test_sigterm_during_start_up_leaves_nothing_behind(tmp_path, moment):
    process, url = start_server(tmp_path)
    if moment == "while_the_core_starts" and MULTIPROCESS:
        wait_until(lambda: socket_folders(tmp_path), "the engine's socket folder exists", process)
    elif moment == "serving":
        wait_until(lambda: healthy(url), "/health answered 200", process)
    children = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    process.wait(HANG_GUARD_S)
    assert_gone(children)
    assert socket_folders(tmp_path) == [], (moment, (tmp_path / "server.log").read_text()[-3000:])


@pytest.mark.skipif(not MULTIPROCESS, reason="in process there is no engine-core process to kill")
@pytest.mark.parametrize("keep_alive", [False, True], ids=["exits", "kept_alive"])
def test_the_server_exits_non_zero_when_its_engine_core_dies(tmp_path, keep_alive):
    process, url = start_server(tmp_path, *(["--keep-alive-on-engine-death"] if keep_alive else []))
    wait_until(lambda: healthy(url), "/health answered 200", process)
    [core] = [child for child in descendants(process.pid) if named(child) == CORE_PROCESS_NAME]
    core.kill()
    if keep_alive:
        wait_until(lambda: httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 503, "/health 503",
                   process)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        process.wait(HANG_GUARD_S)
    else:
        assert process.wait(HANG_GUARD_S) == 1, (tmp_path / "server.log").read_text()[-3000:]
    assert socket_folders(tmp_path) == []


def stream_tokens(url: str, max_tokens: int, on_first) -> tuple[int, str | None]:
    """Stream a completion; call `on_first()` after the first chunk. -> (chunks received, finish_reason)."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    chunks, finish = 0, None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=HANG_GUARD_S) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                chunks += 1
                finish = choice.get("finish_reason") or finish
                if chunks == 1:
                    on_first()
    except httpx.TransportError:   # the server closed the connection mid-stream
        pass
    return chunks, finish


@pytest.mark.parametrize("shutdown_timeout", ["0", str(HANG_GUARD_S)], ids=["abort", "drain"])
def test_the_shutdown_drain_is_bounded_by_shutdown_timeout(tmp_path, shutdown_timeout):
    process, url = start_server(tmp_path, "--shutdown-timeout", shutdown_timeout)
    wait_until(lambda: healthy(url), "/health answered 200", process)
    max_tokens = 1000 if shutdown_timeout == "0" else 30
    chunks, finish = stream_tokens(url, max_tokens, lambda: process.send_signal(signal.SIGTERM))
    process.wait(HANG_GUARD_S)
    if shutdown_timeout == "0":     # aborted at once: the stream was cut long before its 1000 tokens
        assert finish != "length" and chunks < max_tokens, (chunks, finish)
    else:                           # drained: the stream finished, then the server stopped
        assert finish == "length", (chunks, finish)
    assert socket_folders(tmp_path) == []
