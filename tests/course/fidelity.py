"""Shared by tests/course/wrong_answers/test_pNN.py and tests/course/vllm_answers/test_pNN.py.

* A `Wrong` answer is our own deliberately wrong implementation of one exercise: either a whole replacement
  source for the answer cell, or one edit (original -> mutated) of the solution cell. Each must FAIL its
  check with the default seeds (what `pytest labs/` runs), with a message that contains `expect` (the
  words that locate the bug for the learner), while the solution itself passes.
* vLLM's own implementation of a mirrored function (adapted only in its call shape) must PASS the check.
  Its source is read, never copied, from an unpacked vLLM v0.33.0 tree: `MINI_VLLM_SOURCE` (the folder that
  holds `vllm/`; `python scripts/vllm_index.py --keep DIR` leaves one there). Without it those tests skip.
"""

from __future__ import annotations

import ast
import functools
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from labs.course.answers import NotebookAnswers, NotImplementedYet, load_answers
from labs.course.release import REPO_ROOT
from labs.manifest import all_phases


@dataclass(frozen=True)
class Wrong:
    """One wrong answer to `exercise`: `source` (a whole answer cell) or `edit` (original, mutated) of the
    solution cell. `expect`: a fragment the check's failure message must contain."""

    exercise: str
    why: str
    source: str | None = None
    edit: tuple[str, str] | None = None
    expect: str = ""


@functools.cache
def solutions(assignment_id: str) -> NotebookAnswers:
    return load_answers(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")


def check_of(assignment_id: str, exercise: str) -> Callable[..., None]:
    phase = next(p for p in all_phases() if p.assignment_id == assignment_id)
    return phase.exercise(exercise).check


def build_wrong(assignment_id: str, wrong: Wrong) -> Any:
    answers = solutions(assignment_id)
    if wrong.source is not None:
        source = textwrap.dedent(wrong.source)
    else:
        original, mutated = wrong.edit
        source = answers.cell_defining(wrong.exercise).source
        assert source.count(original) == 1, f"the solution of {wrong.exercise} no longer contains {original!r}"
        source = source.replace(original, mutated)
    namespace = dict(answers.namespace)
    exec(compile(source, f"<wrong {wrong.exercise}: {wrong.why}>", "exec"), namespace)  # noqa: S102
    return namespace[wrong.exercise]


def assert_wrong_fails(assignment_id: str, wrong: Wrong) -> None:
    check = check_of(assignment_id, wrong.exercise)
    check(solutions(assignment_id).get(wrong.exercise))          # the solution passes
    candidate = build_wrong(assignment_id, wrong)
    with pytest.raises(AssertionError) as failure:
        check(candidate)
    assert not isinstance(failure.value, NotImplementedYet)
    assert wrong.expect in str(failure.value), (
        f"the check rejected {wrong.why!r} but its message does not say {wrong.expect!r}:\n{failure.value}")


def wrong_params(assignment_id: str, wrongs: list[Wrong]) -> list:
    return [pytest.param(assignment_id, w, id=f"{w.exercise}-{w.why}") for w in wrongs]


# ---- vLLM's own implementations ------------------------------------------------------------------------

def vllm_source_root() -> Path | None:
    root = os.environ.get("MINI_VLLM_SOURCE")
    return Path(root) if root and (Path(root) / "vllm" / "__init__.py").exists() else None


def vllm_definition(path: str, qualname: str, namespace: dict[str, Any]) -> Any:
    """Compile the definition of `qualname` (a function, a class, or `Class.method`) from vLLM's file
    `path` into `namespace` and return it; skips the test when no vLLM tree is available."""
    root = vllm_source_root()
    if root is None:
        pytest.skip("set MINI_VLLM_SOURCE to an unpacked vLLM v0.33.0 tree (the folder holding vllm/)")
    source = (root / path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    node: ast.AST = tree
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part)
    segment = textwrap.dedent(ast.get_source_segment(source, node, padded=True))
    # decorators that only matter in vLLM's runtime (torch.compile, @override) are dropped with the slice
    keyword = {ast.ClassDef: "class ", ast.AsyncFunctionDef: "async def "}.get(type(node), "def ")
    segment = segment[segment.index(keyword):]
    exec(compile(segment, f"<vLLM v0.33.0 {path}::{qualname}>", "exec"), namespace)  # noqa: S102
    return namespace[node.name]
