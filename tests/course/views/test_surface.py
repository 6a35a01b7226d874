"""The course's views read the engine only through its public surface.

`labs/views` may read `llm.llm_engine`, `engine.step()` / `add_request` / `has_unfinished_requests()`,
`engine.add_step_observer(...)` (each step's `StepTrace` and its `snapshot()`), `engine.snapshot_pool()`,
`engine.get_scheduler_stats()`, `engine.scheduler.max_num_scheduled_tokens` / `max_num_running_reqs` and
`engine.model_runner.input_batch` (labs/views/__init__.py). They must never monkeypatch an engine object (replace one
of its methods, `setattr`, `del obj.method`) nor reach into the scheduler's or the KV cache's internals. This is a
source scan (docstrings and comments do not count): each rule below names what it forbids.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

VIEWS = Path(__file__).resolve().parents[3] / "labs" / "views"

# Names a view gives to engine objects: an attribute chain rooted at one of them is an engine read.
ENGINE_ROOTS = {"llm", "llm_engine", "engine", "scheduler", "runner", "model_runner", "input_batch"}
# Internals behind `snapshot_pool()` / the trace: reading them anywhere in a view is forbidden.
INTERNAL_ATTRS = {"kv_cache_manager", "block_pool", "free_block_queue", "batch_update_builder"}
# `<owner>.<attr>` reads that bypass the stats: the scheduler's request map and queues, the runner's states.
INTERNAL_READS = {
    "scheduler": {"requests", "running", "waiting", "finished_req_ids"},
    "runner": {"requests"},
    "model_runner": {"requests"},
}
MAX_DEPTH = 2  # engine.model_runner.input_batch is fine; engine.scheduler.x.y is three deep


def _engine_method_names() -> set[str]:
    """Every method of the engine classes a view touches: assigning one of these names is a monkeypatch."""
    from mini.core.sched.scheduler import Scheduler
    from mini.engine.llm_engine import LLMEngine
    from mini.entrypoints.llm import LLM
    from mini.worker.input_batch import InputBatch
    from mini.worker.model_runner import ModelRunner

    names = set()
    for cls in (LLM, LLMEngine, Scheduler, ModelRunner, InputBatch):
        names |= {name for name, value in inspect.getmembers(cls) if callable(value) and not name.startswith("__")}
    return names


def _chain(node: ast.AST) -> list[str]:
    """`a.b.c` -> ["a", "b", "c"]; a chain that does not start at a plain name starts with "?"."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return parts[::-1]


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _outermost_attributes(tree: ast.AST) -> list[ast.Attribute]:
    """The Attribute nodes that are not themselves the `.value` of a longer chain (`a.b.c`, not `a.b`)."""
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and id(node) not in inner]


def scan_source(source: str, engine_methods: set[str]) -> list[str]:  # noqa: C901 - one branch per surface rule
    """The violations in one module's source, as 'line N: what'."""
    tree = ast.parse(source)
    found: list[str] = []

    def report(node: ast.AST, message: str) -> None:
        found.append(f"line {node.lineno}: {message}")

    for node in ast.walk(tree):
        # 1. no monkeypatching: no assignment to (or del of) an engine method or an engine object's attribute
        for target in _targets(node):
            if isinstance(target, ast.Attribute):
                chain = _chain(target)
                if chain[-1] in engine_methods or set(chain[:-1]) & ENGINE_ROOTS:
                    report(target, f"assigns or deletes `{'.'.join(chain)}`: a view must not change an engine object")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("setattr", "delattr"):
                report(node, f"calls {node.func.id}(): a view must not change an engine object")
            # 2. no duck typing on engine objects: the surface is documented, read it directly
            if node.func.id in ("getattr", "hasattr") and node.args:
                chain = _chain(node.args[0])
                if set(chain) & ENGINE_ROOTS:
                    report(node, f"{node.func.id}({'.'.join(chain)}, ...): duck typing on an engine object; "
                                 "read the documented surface directly")
                name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
                if name in INTERNAL_ATTRS:
                    report(node, f"{node.func.id}(..., {name!r}): an engine internal")
        # 3. no internals: the KV pool and the scheduler's queues are read through a PoolSnapshot
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if node.attr in INTERNAL_ATTRS:
                report(node, f"reads `{'.'.join(chain)}`: use engine.snapshot_pool() / trace.snapshot() (PoolSnapshot)")
            if len(chain) > 1 and node.attr in INTERNAL_READS.get(chain[-2], ()):
                report(node, f"reads `{'.'.join(chain)}`: use a PoolSnapshot / a step observer's StepTrace")
    # 4. never three attributes deep into the engine
    for node in _outermost_attributes(tree):
        chain = _chain(node)
        roots = [index for index, part in enumerate(chain) if part in ENGINE_ROOTS]
        if roots and len(chain) - 1 - roots[0] > MAX_DEPTH:
            report(node, f"reads `{'.'.join(chain)}`: more than {MAX_DEPTH} attributes deep into the engine")
    return sorted(set(found), key=lambda line: int(line.split(":")[0].split()[1]))


@pytest.fixture(scope="module")
def engine_methods() -> set[str]:
    return _engine_method_names()


@pytest.mark.parametrize("path", sorted(VIEWS.glob("*.py")), ids=lambda p: p.name)
def test_views_read_only_the_public_engine_surface(path, engine_methods):
    violations = scan_source(path.read_text(), engine_methods)
    assert not violations, (
        f"labs/views/{path.name} reaches past the engine's public surface "
        "(allowed: llm.llm_engine, engine.step/add_request/has_unfinished_requests, "
        "engine.add_step_observer (StepTrace), engine.snapshot_pool(), engine.get_scheduler_stats(), "
        "engine.model_runner.input_batch):\n  " + "\n  ".join(violations)
    )


BAD_VIEW = '''
def record(llm):
    engine = llm.llm_engine
    scheduler = engine.scheduler
    original = scheduler.schedule
    scheduler.schedule = lambda: original()
    batch = engine.model_runner.input_batch
    batch.get_batch_update = lambda: None
    setattr(scheduler, "schedule", original)
    del batch.get_batch_update
    pool = scheduler.kv_cache_manager.block_pool
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    live = scheduler.requests.values()
    names = [r.request_id for r in scheduler.running] + [r.request_id for r in scheduler.waiting]
    states = engine.model_runner.requests
    inputs = getattr(engine.model_runner, "input_batch", None)
    deep = llm.llm_engine.model_runner.input_batch
    return free, live, names, states, inputs, deep
'''

GOOD_VIEW = '''
def record(llm):
    engine = llm.llm_engine
    runner = engine.model_runner
    traces = []
    remove = engine.add_step_observer(lambda trace: traces.append((trace, trace.snapshot())))
    engine.step()
    remove()
    trace, pool = traces[0]
    stats = engine.get_scheduler_stats()
    rows = [state.req_id for state in runner.input_batch.occupied_requests()]
    snapshot = make_snapshot(pool.free_block_ids, trace.scheduler_output.scheduled_cached_reqs.req_ids, rows)
    snapshot.events = []
    return snapshot, trace.inputs, stats.num_running_reqs, engine.scheduler.max_num_scheduled_tokens
'''


def test_the_scan_catches_monkeypatching_and_internal_reads(engine_methods):
    violations = scan_source(BAD_VIEW, engine_methods)
    text = "\n".join(violations)
    for expected in (
        "assigns or deletes `scheduler.schedule`",
        "assigns or deletes `batch.get_batch_update`",
        "calls setattr()",
        "reads `scheduler.kv_cache_manager`",
        "block_pool",
        "free_block_queue",
        "reads `scheduler.requests`",
        "reads `scheduler.running`",
        "reads `scheduler.waiting`",
        "reads `engine.model_runner.requests`",
        "getattr(engine.model_runner, ...)",
        "more than 2 attributes deep",
    ):
        assert expected in text, f"the scan missed {expected!r}; it found:\n{text}"
    assert sum("assigns or deletes `batch.get_batch_update`" in v for v in violations) == 2  # set and del


def test_the_scan_accepts_the_public_surface(engine_methods):
    assert scan_source(GOOD_VIEW, engine_methods) == []
