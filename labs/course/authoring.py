"""Mirrors no vllm/v1 file: helpers to build a phase's nbgrader cells from Python.

A phase author can write a source notebook in Jupyter (Create Assignment toolbar) or build it with
these helpers; either way the result follows docs/authoring.md:

- `setup(...)`: a code cell tagged "setup" (imports, constants); the labs grader runs these first;
- `answer(...)`: an nbgrader autograded-answer cell defining ONE function or class;
- `tests(...)`: an nbgrader autograder-tests cell (locked, with points, visible + hidden checks).
"""

from __future__ import annotations

from collections.abc import Iterable

import nbformat
from nbformat import NotebookNode

from labs.course.notebook_format import normalize_notebook

NBGRADER_SCHEMA_VERSION = 3


def markdown(text: str, cell_id: str) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(text.strip("\n"))
    cell.id = cell_id
    return cell


def code(source: str, cell_id: str, tags: Iterable[str] = ()) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(source.strip("\n"))
    cell.id = cell_id
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def setup(source: str, cell_id: str) -> NotebookNode:
    """A code cell the labs grader runs before the answer cells (imports, constants, helpers)."""
    return code(source, cell_id, tags=["setup"])


def _nbgrader(
    grade_id: str, *, solution: bool, grade: bool, locked: bool, points: float | None = None
) -> dict:
    metadata = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        metadata["points"] = points
    return metadata


def answer(source: str, grade_id: str) -> NotebookNode:
    """An autograded-answer cell: keep `def`/`class` lines outside `### BEGIN SOLUTION` blocks."""
    if "### BEGIN SOLUTION" not in source:
        raise ValueError(f"answer cell {grade_id!r}: source must contain '### BEGIN SOLUTION'")
    cell = code(source, grade_id)
    cell.metadata["nbgrader"] = _nbgrader(grade_id, solution=True, grade=False, locked=False)
    return cell


def tests(source: str, grade_id: str, points: float) -> NotebookNode:
    """An autograder-tests cell worth `points`; put extra cases inside `### BEGIN HIDDEN TESTS`."""
    if points <= 0:
        raise ValueError(f"tests cell {grade_id!r}: points must be > 0, got {points}")
    cell = code(source, grade_id)
    cell.metadata["nbgrader"] = _nbgrader(grade_id, solution=False, grade=True, locked=True, points=points)
    return cell


def new_notebook(cells: list[NotebookNode]) -> NotebookNode:
    """A normalized notebook; raises ValueError on duplicated cell ids or grade ids."""
    seen: set[str] = set()
    for cell in cells:
        key = cell.metadata.get("nbgrader", {}).get("grade_id", cell.id)
        for name in {key, cell.id}:
            if name in seen:
                raise ValueError(f"duplicated cell id / grade_id {name!r}; each must be unique")
            seen.add(name)
    return normalize_notebook(nbformat.v4.new_notebook(cells=cells))
