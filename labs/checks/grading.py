"""Mirrors no vllm/v1 file: every graded check runs isolated, in a child process with limits.

A learner's answer can do worse than return a wrong value: a Triton kernel that reads outside its tensors
segfaults the interpreter, a loop that never ends hangs, a mutant that appends to the list it walks grows
until the machine swaps (one grew a grading process to 17 GB). Run in the grader's own process, any of those
ends the whole `pytest labs/` run (or the notebook's kernel) with no summary. So a check marked `@graded`
runs in a child process forked for it, and the parent watches that child:

* **a crash** (the child dies of a signal) fails the exercise: "`name` crashed (SIGSEGV, segmentation
  fault) ...", with what usually causes it;
* **a hang**: the child (with its own children) used more than `cpu_limit_s` seconds of CPU time, or used
  no CPU at all for `idle_limit_s` seconds while asleep (blocked on something that never comes; a child that
  is runnable but waiting for a core is not idle). CPU time, not wall-clock time: a busy machine slows a check
  down but does not make it use more CPU, so a correct answer never fails for the machine being loaded;
* **a runaway allocation**: the memory private to the child and its children exceeds `memory_limit_gib`.

Each ends the child's whole process group and fails that exercise alone, with a message that names it. The
check's own verdict (an AssertionError with its counterexample, NotImplementedYet) travels back to the parent
and is raised there unchanged, with whatever the check printed.

A child starts as a copy of the grading process, so what the parent has already loaded costs the child
nothing, and what a child loads is lost with it. A checks module can name the cached builders its checks share
(a tokenizer, a tiny model) in a `WARM_UP` tuple: they run once in the parent before its first child is forked.

Isolation is skipped, and the check runs in the caller's process, where a process cannot fork (Windows),
where CUDA is already initialized in the caller (a forked child cannot use it), inside a child already, and
when `MINI_LABS_ISOLATION=0`. The limits can be raised with `MINI_LABS_CPU_LIMIT_S`,
`MINI_LABS_IDLE_LIMIT_S` and `MINI_LABS_MEMORY_LIMIT_GIB`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import io
import os
import pickle
import select
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labs.course.answers import AnswerCellError, NotImplementedYet

ENV_ISOLATION = "MINI_LABS_ISOLATION"
_POLL_S = 0.2
_in_child = False


@dataclass(frozen=True, slots=True)
class Limits:
    """What one graded check may use (its child process and the processes it starts, together)."""

    # Measured on the solutions (2 cores, each exercise loaded and checked in its child): at most 3 s of CPU
    # and 300 MiB of private memory. The limits leave a slower laptop 40x and 7x that.
    cpu_limit_s: float = 120.0      # CPU seconds
    idle_limit_s: float = 60.0      # wall-clock seconds in a row without any CPU use
    memory_limit_gib: float = 2.0   # memory private to the check's processes

    @classmethod
    def from_env(cls) -> Limits:
        def number(name: str, default: float) -> float:
            value = os.environ.get(name)
            try:
                return float(value) if value else default
            except ValueError:
                raise ValueError(f"{name}={value!r}: expected a number") from None

        base = cls()
        return cls(number("MINI_LABS_CPU_LIMIT_S", base.cpu_limit_s),
                   number("MINI_LABS_IDLE_LIMIT_S", base.idle_limit_s),
                   number("MINI_LABS_MEMORY_LIMIT_GIB", base.memory_limit_gib))


def graded(check: Callable[..., None]) -> Callable[..., None]:
    """Mark `check` as an exercise's check: each call runs isolated (`run_isolated`, see the module docstring)."""

    @functools.wraps(check)
    def run(candidate, *args, **kwargs):
        if isolation_available():
            warm_up(check.__module__)
        return run_isolated(functools.partial(check, candidate, *args, **kwargs), what=_what(check, candidate))

    return run


_warmed: set[str] = set()


def import_engine_stack() -> None:
    """A `WARM_UP` builder for checks that build engines: the imports an engine needs (transformers' among
    them, about 2 s), done once in the parent instead of in every child."""
    import transformers  # noqa: F401

    import mini.entrypoints.llm  # noqa: F401


def warm_up(module_name: str) -> None:
    """Run the `WARM_UP` builders of a checks module once in this process (see the module docstring)."""
    if module_name in _warmed:
        return
    _warmed.add(module_name)
    for build in getattr(sys.modules.get(module_name), "WARM_UP", ()):
        with contextlib.suppress(Exception):  # a builder that fails here fails again, with feedback, in the check
            build()


def _what(check: Callable[..., Any], candidate: Any) -> str:
    name = getattr(candidate, "__name__", None)
    return f"`{name}`" if isinstance(name, str) else f"the answer graded by {check.__name__}"


def grade_exercise(path, assignment_id: str, exercise) -> None:
    """`pytest labs/`: load the notebook's answers AND run the exercise's check in one isolated child, so an
    answer cell that hangs or crashes while it is defined fails its exercise alone too. The parent first
    imports the modules the notebook's setup cells import (nothing of the learner's runs there), so each
    child starts warm."""
    import importlib

    from labs.course.answers import load_answers, setup_modules

    for module in setup_modules(path):
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    if isolation_available():
        warm_up(exercise.check.__module__)

    def work() -> None:
        exercise.check(load_answers(path).get(exercise.name))

    run_isolated(work, what=f"{assignment_id}::{exercise.name}")


def isolation_available() -> bool:
    if _in_child or not hasattr(os, "fork") or os.environ.get(ENV_ISOLATION, "1") == "0":
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def run_isolated(work: Callable[[], Any], *, what: str, limits: Limits | None = None) -> None:
    """Run `work()` in a forked child under `limits`; re-raise its exception here, or fail with why it died."""
    if not isolation_available():
        work()
        return
    limits = limits or Limits.from_env()
    _release_openmp_threads()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    read_end, write_end = os.pipe()
    crash_read, crash_write = os.pipe()  # where the child's faulthandler writes the frames of a crash
    with warnings.catch_warnings():  # Python 3.12+ warns about forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        os.close(crash_read)
        _child_main(work, write_end, crash_write)
    os.close(write_end)
    os.close(crash_write)
    try:
        payload, status, reason = _watch(pid, read_end, limits)
        crash_frames = _read_nowait(crash_read).decode(errors="replace")
    finally:
        os.close(read_end)
        os.close(crash_read)
    _settle(payload, status, reason, what, limits, crash_frames)


# ---- the child -----------------------------------------------------------------------------------------------

_crash_file = None


def _child_main(work: Callable[[], Any], write_end: int, crash_write: int) -> None:
    global _in_child, _crash_file
    _in_child = True
    code = 0
    try:
        _crash_file = os.fdopen(crash_write, "w")
        faulthandler.enable(file=_crash_file, all_threads=False)  # a crash's frames go to the parent
        _no_core_dump()
        os.setpgid(0, 0)  # its own process group: the parent can end it with everything it started
        _rebuild_torch_thread_pool()
        captured = io.StringIO()
        sys.stdout = sys.stderr = captured
        try:
            work()
            outcome: tuple = ("passed", None)
        except BaseException as error:  # noqa: BLE001 - everything travels back to the parent
            outcome = ("raised", _portable(error))
        data = pickle.dumps((*outcome, captured.getvalue()))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(len(data).to_bytes(8, "little") + data)
    except BaseException:  # noqa: BLE001 - nothing may escape into the parent's code
        code = 70
    finally:
        os._exit(code)


def _no_core_dump() -> None:
    """A crash writes no core file: dumping a process that holds torch (or piping it to a crash collector, as
    CI machines do) takes seconds of no CPU, which read as idle. A soft RLIMIT_CORE of 1 byte stops both kinds
    of dump (Linux skips a file dump smaller than a page and refuses a piped dump at exactly 1)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        soft = 1 if hard == resource.RLIM_INFINITY else min(1, hard)
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def _rebuild_torch_thread_pool() -> None:
    """After a fork, torch rebuilds its pthreadpool lazily, on the first thread that asks for it, and two threads
    asking at once can see it missing ("pool INTERNAL ASSERT FAILED ... Invalid thread pool!": seen when a
    notebook's setup cell had set the thread count and a check then ran two tensor-parallel ranks in threads).
    Asking once here, on the child's only thread, rebuilds it before any check starts a thread."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(torch.get_num_threads())


def _portable(error: BaseException) -> tuple[str, str, str]:
    """(kind, class name, message) of an exception: the course's own classes are not importable by pickle
    (their __module__ is "builtins", so pytest's summary reads well), so they travel as names."""
    message = str(error)
    kind = "error"
    if isinstance(error, NotImplementedYet):
        kind = "not-implemented"
    elif isinstance(error, AnswerCellError):
        kind = "answer-cell"
    elif isinstance(error, AssertionError):
        kind = "assertion"
    elif type(error).__name__ == "Skipped":
        kind = "skipped"
    elif isinstance(error, SystemExit):
        kind = "exit"
    else:
        message = f"{message}\n{''.join(traceback.format_exception(error)[-12:])}"
    return kind, type(error).__name__, message


# ---- the parent ----------------------------------------------------------------------------------------------

def _watch(pid: int, read_end: int, limits: Limits) -> tuple[bytes, int | None, str | None]:
    """Read the child's verdict while enforcing the limits: (payload, wait status or None, why it was ended)."""
    chunks: list[bytes] = []
    reason = None
    last_cpu, last_progress = -1.0, time.monotonic()
    while True:
        ready, _, _ = select.select([read_end], [], [], _POLL_S)
        if ready:
            chunk = os.read(read_end, 1 << 20)
            if chunk:
                chunks.append(chunk)
                continue
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            while chunk := _read_nowait(read_end):
                chunks.append(chunk)
            return b"".join(chunks), status, None
        usage = _usage(pid)
        if usage is None:  # nothing to measure with: only the crash watch works
            continue
        cpu_s, private_bytes, runnable = usage
        now = time.monotonic()
        if cpu_s > last_cpu or runnable:
            last_cpu, last_progress = cpu_s, now
        if private_bytes > limits.memory_limit_gib * 2**30:
            reason = f"memory: {private_bytes / 2**30:.1f} GiB"
        elif cpu_s > limits.cpu_limit_s:
            reason = f"cpu: {cpu_s:.0f} s"
        elif now - last_progress > limits.idle_limit_s:
            reason = f"idle: {now - last_progress:.0f} s"
        if reason:
            _end_group(pid)
            os.waitpid(pid, 0)
            return b"".join(chunks), None, reason


def _read_nowait(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], 0)
    return os.read(fd, 1 << 20) if ready else b""


def _end_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()


def _usage(pid: int) -> tuple[float, int, bool] | None:
    """(CPU seconds, private memory bytes, whether any is runnable) of the process `pid` and its descendants,
    reaped ones' CPU included; None where it cannot be measured (no psutil, the process just went). A runnable
    process (running, or waiting for a core on a loaded machine) is making progress even when its CPU time
    has not moved since the last look."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    cpu_s, private_bytes, runnable = 0.0, 0, False
    for process in processes:
        with contextlib.suppress(psutil.Error):
            runnable = runnable or process.status() in (psutil.STATUS_RUNNING, psutil.STATUS_WAKING)
            times = process.cpu_times()
            cpu_s += times.user + times.system + getattr(times, "children_user", 0.0) + getattr(
                times, "children_system", 0.0)
            private_bytes += _private_bytes(process)
    return cpu_s, private_bytes, runnable


def _private_bytes(process) -> int:
    """Memory only this process maps (after a fork, pages still shared with the parent do not count)."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup") as rollup:
            fields = dict(line.split(":", 1) for line in rollup if line.startswith(("Private_", "Swap:")))
        return sum(int(value.split()[0]) for value in fields.values()) * 1024
    except (OSError, ValueError):
        return process.memory_full_info().uss


def _crash_site(frames: str) -> str:
    """The innermost frame of the faulthandler dump in the learner's code (a notebook cell), else ''."""
    import sysconfig
    from pathlib import Path

    course = str(Path(__file__).resolve().parents[2])
    ours = (f"{course}/labs/", f"{course}/mini/", *{sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    for line in frames.splitlines():  # faulthandler lists the most recent call first
        line = line.strip()
        if line.startswith('File "') and not line[len('File "'):].startswith(ours):
            return line.removeprefix("File ")
    return ""


def _settle(payload: bytes, status: int | None, reason: str | None, what: str, limits: Limits,
            crash_frames: str = "") -> None:
    """Raise what the child's run means for the exercise; return if it passed."""
    if reason is not None:
        kind, _, measured = reason.partition(": ")
        detail = {
            "memory": (f"used more than {limits.memory_limit_gib:g} GiB of memory ({measured} when it was stopped)",
                       ("something grows without bound: a list appended to while it is walked, a tensor sized by "
                       "a wrong count, a loop that never stops allocating")),
            "cpu": (f"ran for more than {limits.cpu_limit_s:g} s of CPU time without finishing",
                    "an endless loop? check every loop's exit condition on the case the check runs first"),
            "idle": (f"stopped making progress: no CPU used for {limits.idle_limit_s:g} s",
                     ("it waits for something that never comes: a blocking get on an empty queue, a lock, an "
                     "await on a future nobody completes")),
        }[kind]
        raise AssertionError(f"{what} {detail[0]}; the check was stopped and this exercise fails alone\n"
                             f"  hint: {detail[1]}") from None
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        description = signal.strsignal(number) or ""
        site = _crash_site(crash_frames)
        raise AssertionError(
            f"{what} crashed ({name}, {description.lower()}) while its check ran; this exercise fails alone\n"
            + (f"  where: {site}\n" if site else "")
            + "  hint: a crash in a kernel or in native code usually means a read or a write outside a tensor: "
            "an index or a mask that lets a lane past the end, a grid larger than the data, a stride of the "
            "wrong tensor") from None
    if not payload:
        code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else "?"
        raise AssertionError(f"{what}: the check's process ended (exit code {code}) without a verdict; "
                             "did the answer call os._exit or close the standard streams?") from None
    size = int.from_bytes(payload[:8], "little")
    verdict, error, printed = pickle.loads(payload[8:8 + size])  # our own child's message
    if printed:
        print(printed, end="")
    if verdict == "passed":
        return
    kind, class_name, message = error
    if kind == "not-implemented":
        raise NotImplementedYet(message) from None
    if kind == "answer-cell":
        raise AnswerCellError(message) from None
    if kind == "assertion":
        raise AssertionError(message) from None
    if kind == "skipped":
        import pytest

        pytest.skip(message)
    if kind == "exit":
        raise AssertionError(f"{what} called sys.exit({message}) while its check ran") from None
    raise AssertionError(f"{class_name}: {message}") from None


def _release_openmp_threads() -> None:
    """A forked child must not inherit a GNU OpenMP pool whose threads it does not have (mini/system_utils.py)."""
    if "torch" in sys.modules:
        from mini.system_utils import release_libgomp_threads

        release_libgomp_threads()
