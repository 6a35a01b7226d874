"""GNU OpenMP and the engine's other threads and processes (mirrors `_release_libgomp_threads` in
vllm/utils/system_utils.py).

torch's CPU kernels run their parallel regions on GNU OpenMP (libgomp). libgomp keeps a pool of worker
threads for EACH thread that has entered a parallel region, and those pools outlive the region. Two facts
about them matter to an engine that forks a process or moves its forward to another thread:

1. **Fork.** libgomp has no fork handler. A child forked after the parent ran a parallel region inherits the
   parent's pool as data but not its threads, and the child's first parallel region on that thread waits
   for them forever.
2. **Throttling.** libgomp counts the worker threads of all pools in the process. Once they outnumber the
   CPUs, its barriers stop spinning after 100 turns instead of 300,000 (`gomp_throttled_spin_count_var`)
   and put the threads to sleep in the kernel, so every parallel region pays for waking them. A second pool
   appears as soon as a second thread runs a multi-threaded op; a forked child starts with the parent's
   count. Measured on 2 cores (the shipped model, 16 requests): a sync engine core forked after the parent
   ran one multi-threaded op took 12.3 ms a step against 7.4 ms; an engine in a process where another
   thread had stepped a model took 11.6 ms against 7.0 ms.

`release_libgomp_threads()` pauses the calling thread's pool (`omp_pause_resource_all`, OpenMP 5.0): its
threads are joined and no longer counted, and libgomp builds a new pool on that thread's next parallel
region. The engine calls it before it forks (vLLM does the same, in `get_mp_context`), and on the thread
that built the model before a worker thread takes the forward over (async scheduling in process, the
in-process `AsyncLLM` loop). It does nothing where libgomp is not loaded (macOS, another OpenMP runtime).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable

OMP_PAUSE_HARD = 2   # omp_pause_resource_t: join the threads and free the pool


def loaded_libgomp_paths() -> set[str]:
    """The libgomp shared objects this process has loaded (Linux: read from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return set()


_pause_functions: tuple[Callable[[int], int], ...] = ()


def libgomp_pause_functions() -> tuple[Callable[[int], int], ...]:
    """`omp_pause_resource_all` of each loaded libgomp, looked up once they are found: reading /proc/self/maps
    takes about half a millisecond, and an async-scheduling engine may release at every step."""
    global _pause_functions
    if not _pause_functions:
        found = []
        for path in sorted(loaded_libgomp_paths()):
            with contextlib.suppress(OSError, AttributeError):
                found.append(ctypes.CDLL(path).omp_pause_resource_all)
        _pause_functions = tuple(found)
    return _pause_functions


def release_libgomp_threads() -> None:
    """Join the calling thread's idle OpenMP pool (module docstring); libgomp makes a new one when needed."""
    for pause in libgomp_pause_functions():
        pause(OMP_PAUSE_HARD)


__all__ = ["OMP_PAUSE_HARD", "libgomp_pause_functions", "loaded_libgomp_paths", "release_libgomp_threads"]
