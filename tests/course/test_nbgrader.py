"""An nbgrader round trip per phase in a scratch course root: generate_assignment, then autograde three
submissions (solutions -> full marks, untouched release -> 0, the first exercise filled -> exactly the
points of its test cells).

To keep it fast each course holds the phase's LAB only: its markdown, setup, answer and test cells (the
demo and plug-in cells run the engine and are covered by tests/course/test_notebooks.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT, _nbgrader_config, list_assignments

pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # nbgrader's own, harmless


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _first_exercise(notebook) -> tuple[str, set[str]]:
    """The first answer cell's id and the grade ids of the test cells that follow it (up to the next answer)."""
    answer_id, test_ids = None, set()
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and not meta.get("grade"):
            if answer_id is not None:
                break
            answer_id = cell.id
        elif answer_id is not None and meta.get("grade") and not meta.get("solution"):
            test_ids.add(_grade_id(cell))
    assert answer_id and test_ids, "the notebook has no answer cell followed by a test cell"
    return answer_id, test_ids


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


def _submit(course_root: Path, assignment: str, student: str, notebook) -> None:
    path = course_root / "submitted" / student / assignment / f"{assignment}.ipynb"
    path.parent.mkdir(parents=True)
    write_normalized(notebook, path)


@pytest.fixture(scope="module", params=list_assignments())
def graded_course(request, tmp_path_factory):
    assignment = request.param
    course_root = tmp_path_factory.mktemp(f"course-{assignment}")
    source = read_notebook(REPO_ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    source.cells = [c for c in source.cells if _is_lab_cell(c)]
    write_normalized(source, course_root / "solutions" / assignment / f"{assignment}.ipynb")
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course_root)

    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), old_path) if p)  # for the kernels
    try:
        api = _api(course_root)
        result = api.generate_assignment(assignment)
        assert result["success"], result["log"]
        release = read_notebook(course_root / "phases" / assignment / f"{assignment}.ipynb")

        one = read_notebook(course_root / "phases" / assignment / f"{assignment}.ipynb")
        solved = {c.id: c.source for c in source.cells}
        filled_answer, filled_tests = _first_exercise(source)
        for cell in one.cells:
            if cell.id == filled_answer:
                cell.source = solved[cell.id]
        _submit(course_root, assignment, "solutions", source)
        _submit(course_root, assignment, "untouched", release)
        _submit(course_root, assignment, "one-exercise", one)
        for student in ("solutions", "untouched", "one-exercise"):
            result = api.autograde(assignment, student)
            assert result["success"], result["log"]
    finally:
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    return course_root, assignment, filled_tests


def _grades(graded_course, student: str) -> dict[str, tuple[float, float]]:
    from nbgrader.api import Gradebook

    course_root, assignment, _ = graded_course
    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(assignment, assignment, student)
        return {grade.name: (grade.score, grade.max_score) for grade in notebook.grades}


def test_solutions_get_full_marks(graded_course):
    grades = _grades(graded_course, "solutions")
    assert len(grades) >= 3
    assert all(score == max_score > 0 for score, max_score in grades.values()), grades


def test_untouched_release_gets_zero(graded_course):
    grades = _grades(graded_course, "untouched")
    assert grades and all(score == 0 for score, _ in grades.values()), grades


def test_one_exercise_gets_exactly_its_points(graded_course):
    _, _, filled_tests = graded_course
    grades = _grades(graded_course, "one-exercise")
    earned = {name: score for name, (score, _) in grades.items() if score > 0}
    assert earned == {name: grades[name][1] for name in filled_tests}, grades


def test_hidden_tests_are_restored_when_grading(graded_course):
    course_root, assignment, _ = graded_course
    graded = read_notebook(course_root / "autograded" / "solutions" / assignment / f"{assignment}.ipynb")
    released = read_notebook(course_root / "phases" / assignment / f"{assignment}.ipynb")
    assert any("BEGIN HIDDEN TESTS" in c.source for c in graded.cells)
    assert not any("BEGIN HIDDEN TESTS" in c.source for c in released.cells)
