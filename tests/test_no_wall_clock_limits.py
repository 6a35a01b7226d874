"""No wall-clock limit in any test (issue 38): a test waits for what must happen up to a hang guard
(tests/patience.py), never for a fixed few seconds that a busy machine can exceed.

Refused, in the code of every file under tests/ (strings, such as the wrong answers' sources, are not code):
a `timeout=`, `timeout_s=` or `wait_s=` argument (by keyword, or by position to a function of the tests that
names its parameter so, such as the browser harness' `wait_for(condition, timeout_s, what)`), a `*TIMEOUT*` /
`*SAFETY*` / `*_WAIT*` constant or a `time.monotonic() + N` deadline whose number N is a literal from 1 s up to
(not including) 10 minutes.
Sub-second literals are polling steps (a `get(timeout=0.05)` in a loop), not limits.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NAMES = ("timeout", "timeout_s", "wait_s")
CONSTANT_WORDS = ("TIMEOUT", "SAFETY", "_WAIT", "DEADLINE")
LOW, HIGH = 1.0, 600.0


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _is_clock(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("monotonic", "perf_counter", "time"))


def timeout_positions(source: str) -> dict[str, int]:
    """{function name: the position, as a caller counts it, of its parameter named like a timeout}."""
    positions = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [argument.arg for argument in node.args.args]
            offset = 1 if names[:1] in (["self"], ["cls"]) else 0
            for index, name in enumerate(names):
                if name in NAMES:
                    positions[node.name] = index - offset
    return positions


def wall_clock_limits(source: str, positions: dict[str, int] | None = None) -> list[tuple[int, str]]:
    found = []
    positions = {**timeout_positions(source), **(positions or {})}
    for node in ast.walk(ast.parse(source)):
        candidates: list[tuple[ast.AST, str]] = []
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            index = positions.get(name, -1)
            if 0 <= index < len(node.args):
                candidates.append((node.args[index], f"{name}(...) positional timeout"))
        if isinstance(node, ast.keyword) and node.arg in NAMES:
            candidates.append((node.value, f"{node.arg}="))
        elif isinstance(node, ast.arguments):
            defaults = node.defaults[-len(node.args) :] if node.defaults else []
            for argument, default in zip(node.args[len(node.args) - len(defaults):], defaults, strict=False):
                if argument.arg in NAMES:
                    candidates.append((default, f"default {argument.arg}="))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and any(w in target.id for w in CONSTANT_WORDS):
                    candidates.append((node.value, f"{target.id} ="))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_clock(node.left):
            candidates.append((node.right, "clock +"))
        for value, what in candidates:
            number = _number(value)
            if number is not None and LOW <= number < HIGH:
                found.append((value.lineno, f"{what} {number:g}"))
    return found


def test_no_test_waits_a_fixed_few_seconds():
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(TESTS.rglob("*.py"))}
    positions = {name: index for source in sources.values() for name, index in timeout_positions(source).items()}
    offenders = [f"{path.relative_to(TESTS)}:{line}: {what}"
                 for path, source in sources.items()
                 for line, what in wall_clock_limits(source, positions)]
    assert not offenders, ("wall-clock limits in tests (poll up to tests/patience.py's HANG_GUARD_S / RUN_GUARD_S "
                           "instead):\n" + "\n".join(offenders))


def test_the_rule_refuses_limits_and_spares_polls_and_guards():
    assert wall_clock_limits("httpx.get(url, timeout=10)") == [(1, "timeout= 10")]
    assert wall_clock_limits("SAFETY_S = 30.0") == [(1, "SAFETY_S = 30")]
    assert wall_clock_limits("deadline = time.monotonic() + 15") == [(1, "clock + 15")]
    assert wall_clock_limits("def wait(pids, wait_s=15.0): pass") == [(1, "default wait_s= 15")]
    assert wall_clock_limits("def wait_for(condition, timeout_s, what): pass\nwait_for(ready, 60, 'x')") == [
        (2, "wait_for(...) positional timeout 60")]
    assert wall_clock_limits("page.run_all(60)", {"run_all": 0}) == [(1, "run_all(...) positional timeout 60")]
    assert wall_clock_limits("queue.get(timeout=0.05)\nhttpx.get(url, timeout=HANG_GUARD_S)\nx = 'timeout=10'") == []
