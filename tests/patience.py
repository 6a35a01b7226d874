"""How long a test waits: never a statement about speed (issue 38: the suite must pass on a busy machine).

A test waits for something that must happen (a server to answer, a process to exit, an event to fire) by
polling in short steps up to a hang guard: long enough that no correct program on a loaded laptop reaches
it (a 2-token completion once took 32 s on a 2-core machine with both cores busy elsewhere), short enough
that a real hang still ends the run with a failure naming what never happened. Latency and throughput are
measured by benchmarks (`python -m mini bench ...`), as ratios against a peer in one run.

`tests/test_no_wall_clock_limits.py` holds every test to this: a literal wait of 1 s to 10 minutes in a
test is refused.
"""

HANG_GUARD_S = 600.0     # one wait: a request, a process exit, an event, a queue
RUN_GUARD_S = 1800.0     # one whole subprocess run: a pytest run, a notebook, a CLI command
