"""An nbgrader round trip in a scratch course root: generate_assignment, then autograde three
submissions (solutions -> full marks, untouched release -> 0, one exercise filled -> its points).

To keep it fast the course holds phase 02's LAB: its markdown, setup, answer and test cells (the demo
and plug-in cells run the engine and are covered by test_course_notebooks.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mini.course.notebook_format import read_notebook, write_normalized
from mini.course.release import REPO_ROOT, _nbgrader_config

pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # nbgrader's own, harmless

ASSIGNMENT = "02_slot_mapping"
FILLED_EXERCISE = ("answer-slot-mapping", "test-slot-mapping")


def _is_lab_cell(cell) -> bool:
    return (
        cell.cell_type == "markdown"
        or "setup" in cell.metadata.get("tags", [])
        or "nbgrader" in cell.metadata
    )


def _api(course_root: Path):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = _nbgrader_config(course_root)
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def _submit(course_root: Path, student: str, notebook) -> None:
    path = course_root / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    path.parent.mkdir(parents=True)
    write_normalized(notebook, path)


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory):
    course_root = tmp_path_factory.mktemp("course")
    source = read_notebook(REPO_ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    source.cells = [c for c in source.cells if _is_lab_cell(c)]
    write_normalized(source, course_root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course_root)

    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old_path) if p)  # for the kernels
    try:
        api = _api(course_root)
        result = api.generate_assignment(ASSIGNMENT)
        assert result["success"], result["log"]
        release = read_notebook(course_root / "phases" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")

        one = read_notebook(course_root / "phases" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
        solved = {c.id: c.source for c in source.cells}
        for cell in one.cells:
            if cell.id == FILLED_EXERCISE[0]:
                cell.source = solved[cell.id]
        _submit(course_root, "solutions", source)
        _submit(course_root, "untouched", release)
        _submit(course_root, "one-exercise", one)
        for student in ("solutions", "untouched", "one-exercise"):
            result = api.autograde(ASSIGNMENT, student)
            assert result["success"], result["log"]
    finally:
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    return course_root, source


def _grades(course_root: Path, student: str) -> dict[str, tuple[float, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student)
        return {grade.name: (grade.score, grade.max_score) for grade in notebook.grades}


def test_solutions_get_full_marks(graded_course):
    course_root, _ = graded_course
    grades = _grades(course_root, "solutions")
    assert len(grades) >= 3
    assert all(score == max_score > 0 for score, max_score in grades.values()), grades


def test_untouched_release_gets_zero(graded_course):
    course_root, _ = graded_course
    grades = _grades(course_root, "untouched")
    assert grades and all(score == 0 for score, _ in grades.values()), grades


def test_one_exercise_gets_exactly_its_points(graded_course):
    course_root, _ = graded_course
    grades = _grades(course_root, "one-exercise")
    earned = {name: score for name, (score, _) in grades.items() if score > 0}
    assert earned == {FILLED_EXERCISE[1]: grades[FILLED_EXERCISE[1]][1]}, grades


def test_hidden_tests_are_restored_when_grading(graded_course):
    course_root, _ = graded_course
    graded = read_notebook(course_root / "autograded" / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    released = read_notebook(course_root / "phases" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    assert any("BEGIN HIDDEN TESTS" in c.source for c in graded.cells)
    assert not any("BEGIN HIDDEN TESTS" in c.source for c in released.cells)
