"""phases/ is exactly what nbgrader generates from solutions/, and every phase follows labs/README.md."""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

import pytest

from labs.course.answers import defined_names
from labs.course.notebook_format import notebook_text, read_notebook
from labs.course.release import REPO_ROOT, find_drift, list_assignments

ASSIGNMENTS = list_assignments()
PARTS = ("## 1. Deep dive", "## 2. Mini build", "## 3. Lab", "## 4. Plug it in", "## 5. Checklist")


def _nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def test_there_are_phases():
    assert {"00_autoregressive_loop", "01_paged_kv", "02_slot_mapping"} <= set(ASSIGNMENTS)


def test_phases_are_what_nbgrader_generates_from_solutions():
    drift = find_drift()
    assert drift.is_clean(), drift.describe()


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
@pytest.mark.parametrize("side", ["solutions", "phases"])
def test_notebooks_are_stored_normalized(side, assignment_id):
    path = REPO_ROOT / side / assignment_id / f"{assignment_id}.ipynb"
    assert path.read_text(encoding="utf-8") == notebook_text(read_notebook(path)), (
        f"{path} is not normalized: run `python -m labs.course release`"
    )


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_source_notebook_structure(assignment_id):
    notebook = read_notebook(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    positions = [markdown.find(part) for part in PARTS]
    assert -1 not in positions and positions == sorted(positions), f"the five parts, in order: {PARTS}"
    assert re.search(r"vllm/v1/[\w/]+\.py", markdown), "the deep dive cites real vLLM v1 paths"

    grade_ids = [_nbgrader(c)["grade_id"] for c in notebook.cells if _nbgrader(c)]
    assert len(grade_ids) == len(set(grade_ids)), "grade_ids must be unique"
    answers = [c for c in notebook.cells if _nbgrader(c).get("solution")]
    tests = [c for c in notebook.cells if _nbgrader(c).get("grade")]
    assert len(answers) >= 3 and len(tests) >= 3, "at least three graded exercises"
    assert all(_nbgrader(c).get("points", 0) > 0 for c in tests)
    assert all("### BEGIN HIDDEN TESTS" in c.source for c in tests)
    assert any("setup" in c.metadata.get("tags", []) for c in notebook.cells), "a setup cell"

    phase = assignment_id[:2]
    table = importlib.import_module(f"labs.checks.p{phase}").PHASE
    assert table.assignment_id == assignment_id, f"labs/checks/p{phase}.py PHASE names {table.assignment_id}"
    answer_names = []
    for cell in answers:
        names = defined_names(cell.source)
        assert len(names) == 1, f"answer cell {_nbgrader(cell)['grade_id']} must define ONE function or class"
        answer_names += names
    assert [e.name for e in table.exercises] == answer_names, "the phase table lists the answer cells, in order"
    for exercise, cell in zip(table.exercises, tests, strict=True):
        meta = _nbgrader(cell)
        assert (meta["grade_id"], meta["points"]) == (exercise.grade_id, exercise.points), exercise.name
        visible = cell.source.split("### BEGIN HIDDEN TESTS")[0]
        assert f"labs.checks.p{phase}" in visible, "test cells call the shared checks"
        assert f"{exercise.check.__name__}({exercise.name}" in visible, (
            f"test cell {exercise.grade_id} must call {exercise.check.__name__}({exercise.name})")


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
def test_release_notebook_has_no_solutions(assignment_id):
    notebook = read_notebook(Path(REPO_ROOT / "phases" / assignment_id / f"{assignment_id}.ipynb"))
    text = "\n".join(c.source for c in notebook.cells)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    for cell in notebook.cells:
        if _nbgrader(cell).get("solution"):
            assert "raise NotImplementedError()" in cell.source
    assert notebook.metadata.kernelspec.name == "python3"


def test_drift_is_detected_and_release_repairs_it(tmp_path):
    from labs.course.__main__ import main
    from labs.course.release import release

    assignment_id = "01_paged_kv"
    for side in ("solutions", "phases"):
        shutil.copytree(REPO_ROOT / side / assignment_id, tmp_path / side / assignment_id)
    learner = tmp_path / "phases" / assignment_id / f"{assignment_id}.ipynb"
    notebook = read_notebook(learner)
    notebook.cells[0].source += "\nhand edit"
    learner.write_text(notebook_text(notebook), encoding="utf-8")
    (tmp_path / "phases" / assignment_id / "stale.txt").write_text("left over")
    (tmp_path / "phases" / "99_gone").mkdir()
    (tmp_path / "phases" / "99_gone" / "99_gone.ipynb").write_text("{}")

    drift = find_drift(tmp_path)
    assert drift.changed == [f"phases/{assignment_id}/{assignment_id}.ipynb"]
    assert drift.extra == [f"phases/{assignment_id}/stale.txt", "phases/99_gone/99_gone.ipynb"]
    assert "python -m labs.course release" in drift.describe()

    release(tmp_path)
    assert find_drift(tmp_path).is_clean()
    assert (
        learner.read_bytes() == (REPO_ROOT / "phases" / assignment_id / f"{assignment_id}.ipynb").read_bytes()
    )
    assert main(["check", assignment_id]) == 0
