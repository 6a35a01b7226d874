"""The engine-core process dies or its parent does: clear errors, no orphan process, no stale socket file.

mini/engine/core_client.py watches the child's sentinel (vLLM's `MPClientEngineMonitor`); the child watches
its parent's (mini/engine/core_proc.py). Processes are found through /proc (psutil is not installed).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.engine.core_proc import PROCESS_NAME
from mini.engine.exceptions import EngineDeadError

SAFETY_S = HANG_GUARD_S   # a safety net for waits, never an assertion on speed


def _alive(pid: int) -> bool:
    """True while `pid` is an engine-core process that has not exited (a zombie counts as gone)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return comm == PROCESS_NAME and state not in ("Z", "X")


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + SAFETY_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _my_engine_cores() -> list[int]:
    """Engine-core processes whose parent is this test process."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == me and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True, scope="module")
def no_orphans_after_the_module():
    before = set(_my_engine_cores())
    yield
    gc.collect()
    left = [pid for pid in _my_engine_cores() if pid not in before]
    assert left == [], f"engine-core processes left behind: {left}"


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    engine = LLM(num_gpu_blocks_override=64, max_num_seqs=4)
    yield engine
    engine.llm_engine.shutdown()


def test_child_killed_mid_generation_is_engine_dead(llm):
    engine = llm.llm_engine
    client = engine.engine_core
    socket_dir = Path(client.socket_dir)
    engine.add_request("r", "Once upon a time", SamplingParams(max_tokens=500, ignore_eos=True))
    engine.step()
    killed_at = time.monotonic()
    os.kill(client.pid, signal.SIGKILL)
    # The monitor, not a timeout, must end the wait: get_output would otherwise wait SAFETY_S and return
    # an empty EngineCoreOutputs instead of raising.
    with pytest.raises(EngineDeadError, match=r"died: its process ended unexpectedly \(exit code -9\)"):
        while True:
            client.get_output(timeout=SAFETY_S)
    print(f"EngineDeadError {1000 * (time.monotonic() - killed_at):.0f} ms after SIGKILL")
    with pytest.raises(EngineDeadError):
        engine.step()
    with pytest.raises(EngineDeadError):
        engine.add_request("later", "Hello", SamplingParams())
    with pytest.raises(EngineDeadError):
        llm.generate(["Hello"], SamplingParams(max_tokens=2), use_tqdm=False)
    engine.shutdown()
    assert not socket_dir.exists()


def test_shutdown_and_garbage_collection_leave_nothing(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    first = LLM(num_gpu_blocks_override=32)
    pid, socket_dir = first.llm_engine.engine_core.pid, Path(first.llm_engine.engine_core.socket_dir)
    assert _alive(pid) and socket_dir.exists()
    # the folder names its creator, so a session's leftover check ignores other processes' engines (conftest.py)
    assert socket_dir.name.startswith(f"mini-engine-{os.getpid()}-"), socket_dir.name
    first.llm_engine.shutdown()
    assert _wait_gone(pid) and not socket_dir.exists()
    first.llm_engine.shutdown()   # idempotent

    second = LLM(num_gpu_blocks_override=32)
    second.generate(["Hello"], SamplingParams(max_tokens=3), use_tqdm=False)
    pid, socket_dir = second.llm_engine.engine_core.pid, Path(second.llm_engine.engine_core.socket_dir)
    del second
    gc.collect()
    assert _wait_gone(pid) and not socket_dir.exists()


# The parent takes Ctrl-C as a terminal's foreground process does, however the test runner was started: a
# process started with SIGINT ignored (a background job of a non-interactive shell, `nohup`, some CI
# agents) passes SIG_IGN on through fork and exec, and Python then keeps it: no KeyboardInterrupt would
# ever come, and the parent would generate on until the hang guard (the 600 s CI hang of the sigint
# case). Hence the script's first line.
PARENT_SCRIPT = """
import signal; signal.signal(signal.SIGINT, signal.default_int_handler)
import sys, time
from mini import LLM, SamplingParams
llm = LLM(num_gpu_blocks_override=32)
client = llm.llm_engine.engine_core
print("CORE", client.pid, client.socket_dir, flush=True)
if sys.argv[1] == "exit":
    llm.generate(["Hello"], SamplingParams(max_tokens=3), use_tqdm=False)
    sys.exit(0)
while True:   # generating when the signal comes
    llm.generate(["Hello"], SamplingParams(max_tokens=64, ignore_eos=True), use_tqdm=False)
"""


def _start_parent(mode: str) -> tuple[subprocess.Popen, int, Path]:
    """Start PARENT_SCRIPT; mode "sigint_ignored_at_start": as from a runner that ignores SIGINT."""
    env = dict(os.environ, MINI_ENABLE_V1_MULTIPROCESSING="1")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if mode == "sigint_ignored_at_start" else None
    try:
        parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, mode], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    line = parent.stdout.readline()
    assert line.startswith("CORE"), (line, parent.stderr.read() if parent.poll() is not None else "")
    _, pid, socket_dir = line.split()
    return parent, int(pid), Path(socket_dir)


def _signal_disposition(pid: int, signum: int) -> str:
    """"caught", "ignored" or "default": how process `pid` takes `signum` now (Linux: /proc/<pid>/status)."""
    masks = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigCgt"):
            masks[key] = int(value, 16)
    bit = 1 << (signum - 1)
    return "caught" if masks["SigCgt"] & bit else "ignored" if masks["SigIgn"] & bit else "default"


@pytest.mark.parametrize("how", ["exit", "sigint", "sigint_ignored_at_start", "sigkill"])
def test_parent_exit_ctrl_c_or_crash_leaves_no_orphan(how):
    parent, core_pid, socket_dir = _start_parent(how)
    try:
        if how.startswith("sigint"):
            # Checked before the signal: a parent ignoring SIGINT would hang this test until SAFETY_S.
            assert _signal_disposition(parent.pid, signal.SIGINT) == "caught", (
                "the parent does not take SIGINT (Python keeps a SIG_IGN inherited from the test runner)")
        if how != "exit":
            time.sleep(0.5)           # let it generate
            parent.send_signal(signal.SIGINT if how.startswith("sigint") else signal.SIGKILL)
        parent.wait(SAFETY_S)
        assert _wait_gone(core_pid), f"the engine core {core_pid} outlived its parent ({how})"
        deadline = time.monotonic() + SAFETY_S
        while socket_dir.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not socket_dir.exists(), f"stale socket directory {socket_dir} ({how})"
        if how.startswith("sigint"):
            assert "KeyboardInterrupt" in parent.stderr.read()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if _alive(core_pid):
            os.kill(core_pid, signal.SIGKILL)
