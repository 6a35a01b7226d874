"""phases/ is what nbgrader generates from solutions/, every phase follows docs/authoring.md, and nothing the
course tooling does can cost a learner the work they keep in phases/."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from patience import RUN_GUARD_S

from labs.course.answers import defined_names, load_answers
from labs.course.notebook_format import KERNELSPEC, notebook_text, read_notebook
from labs.course.release import (
    REPO_ROOT,
    CourseToolsMissing,
    find_drift,
    generated_files,
    list_assignments,
    release,
    write_release,
)

ASSIGNMENTS = list_assignments()
PARTS = ("## 1. Deep dive", "## 2. Mini build", "## 3. Lab", "## 4. Plug it in", "## 5. Checklist")


def _nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def test_there_are_phases():
    assert {"00_autoregressive_loop", "01_paged_kv", "02_slot_mapping"} <= set(ASSIGNMENTS)


@pytest.fixture(scope="module")
def generated() -> dict[str, bytes]:
    """What the release writes to phases/ (nbgrader runs once for the module's tests)."""
    return generated_files()


def test_phases_are_what_nbgrader_generates_from_solutions(generated):
    drift = find_drift(expected=generated)
    assert drift.is_clean(), drift.describe()


def _changed_since_checkout(path: Path) -> bool:
    """True when git says `path` differs from the commit checked out (or when git cannot tell)."""
    try:
        result = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=RUN_GUARD_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return True
    return bool(result.stdout.strip())


@pytest.mark.parametrize("assignment_id", ASSIGNMENTS)
@pytest.mark.parametrize("side", ["solutions", "phases"])
def test_notebooks_are_stored_normalized(side, assignment_id):
    path = REPO_ROOT / side / assignment_id / f"{assignment_id}.ipynb"
    if side == "phases" and _changed_since_checkout(path):
        # A learner's working copy (JupyterLab rewrites the metadata on save, answers are filled in): the
        # drift test above checks what the release controls; the committed file is checked in CI.
        pytest.skip(f"{path.name} has local changes (a learner's work); the drift check covers it")
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
def test_release_notebook_has_no_solutions(generated, assignment_id):
    # The release as generated (phases/ on disk may hold a learner's answers; drift is checked above).
    notebook = nbformat.reads(generated[f"phases/{assignment_id}/{assignment_id}.ipynb"].decode(), as_version=4)
    text = "\n".join(c.source for c in notebook.cells)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    for cell in notebook.cells:
        if _nbgrader(cell).get("solution"):
            assert "raise NotImplementedError()" in cell.source
    assert notebook.metadata.kernelspec.name == "python3"


def test_drift_is_detected_and_release_repairs_it(tmp_path, generated):
    from labs.course.__main__ import main

    assignment_id = "01_paged_kv"
    relative = f"phases/{assignment_id}/{assignment_id}.ipynb"
    learner = _course_copy(tmp_path, assignment_id, generated)  # the release as generated, not the checkout's
    notebook = read_notebook(learner)
    notebook.cells[0].source += "\nhand edit"
    learner.write_text(notebook_text(notebook), encoding="utf-8")
    (tmp_path / "phases" / assignment_id / "stale.txt").write_text("left over")
    (tmp_path / "phases" / "99_gone").mkdir()
    (tmp_path / "phases" / "99_gone" / "99_gone.ipynb").write_text("{}")

    drift = find_drift(tmp_path)
    assert drift.changed == [f"{relative} (cell 'intro': source differs from the release)"]
    assert drift.extra == [f"phases/{assignment_id}/stale.txt", "phases/99_gone/99_gone.ipynb"]
    assert "python -m labs.course release" in drift.describe()
    assert main(["check", assignment_id, "--root", str(tmp_path)]) == 1

    messages = release(tmp_path)
    assert find_drift(tmp_path).is_clean()
    assert learner.read_bytes() == generated[relative]
    deleted = [m for m in messages if "stale.txt (deleted; a copy is in backups/" in m]
    assert deleted, messages  # nothing release deletes is lost either
    backup = tmp_path / deleted[0].split("a copy is in ")[1].rstrip(")")
    assert backup.read_text() == "left over"
    assert main(["check", assignment_id, "--root", str(tmp_path)]) == 0


def test_release_without_the_course_environment_says_how_to_run_it(monkeypatch, tmp_path, capsys):
    """`python -m labs.course check` with the alembic command nowhere to be found (not the course's Python, or
    no venv activated and none beside it): a sentence saying how to run it, not nbgrader's FileNotFoundError."""
    from labs.course import release as release_module
    from labs.course.__main__ import main

    monkeypatch.setattr(release_module.shutil, "which", lambda name: None)
    monkeypatch.setattr(release_module.sys, "executable", str(tmp_path / "bin" / "python"))
    with pytest.raises(CourseToolsMissing, match=r"\. \.venv/bin/activate"):
        generated_files(["01_paged_kv"])
    assert main(["check", "01_paged_kv"]) == 2
    error = capsys.readouterr().err
    assert "alembic" in error and ". .venv/bin/activate" in error and ".venv/bin/python -m labs.course" in error


# ---------------------------------------------------------------- a learner's work in phases/ is safe

JUPYTERLAB_LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "mimetype": "text/x-python",
    "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3", "version": "3.11.9",
}


def _course_copy(tmp_path: Path, assignment_id: str, generated: dict[str, bytes]) -> Path:
    """solutions/ of one phase and its release AS GENERATED (the checkout's phases/ may hold a learner's work)."""
    shutil.copytree(REPO_ROOT / "solutions" / assignment_id, tmp_path / "solutions" / assignment_id)
    write_release(tmp_path, expected={k: v for k, v in generated.items() if k.startswith(f"phases/{assignment_id}/")})
    return tmp_path / "phases" / assignment_id / f"{assignment_id}.ipynb"


def _work_as_in_jupyterlab(path: Path, answers: dict[str, str]) -> None:
    """Fill answer cells, run them, add a scratch cell and save the way JupyterLab does: its kernelspec
    (another display name), a filled language_info, outputs, execution counts, cell metadata, no trailing
    newline."""
    notebook = read_notebook(path)
    notebook.metadata = nbformat.NotebookNode(
        kernelspec={"display_name": "Python 3 (mini)", "language": "python", "name": "python3"},
        language_info=JUPYTERLAB_LANGUAGE_INFO, widgets={"application/vnd.jupyter.widget-state+json": {}},
    )
    for count, cell in enumerate(notebook.cells, start=1):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
        if cell.cell_type == "code":
            cell.execution_count = count
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
            cell.metadata["execution"] = {"iopub.status.busy": "2025-01-01T00:00:00.000Z"}
    scratch = nbformat.v4.new_code_cell("print('my own scratch cell')")
    scratch.id = "f3c1a9d2-learner"
    notebook.cells.insert(3, scratch)
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False), encoding="utf-8")


def _solutions(assignment_id: str) -> dict[str, str]:
    notebook = read_notebook(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")
    return {c.metadata["nbgrader"]["grade_id"]: c.source
            for c in notebook.cells if c.metadata.get("nbgrader", {}).get("solution")}


def test_a_notebook_saved_by_jupyterlab_with_answers_survives_check_and_release(tmp_path, generated):
    assignment_id = "02_slot_mapping"
    learner = _course_copy(tmp_path, assignment_id, generated)
    answers = dict(list(_solutions(assignment_id).items())[:2])  # two of the exercises done
    _work_as_in_jupyterlab(learner, answers)
    saved = learner.read_bytes()

    drift = find_drift(tmp_path, [assignment_id])  # kernel metadata, outputs, answers: not drift
    assert drift.is_clean(), drift.describe()
    (work,) = drift.learner_work  # but named, so a learner sees check understood their notebook
    assert "2 answer(s) filled in" in work and "1 cell(s) added" in work and "outputs" in work, work
    assert "your work (not drift)" in drift.describe()
    assert release(tmp_path, [assignment_id]) == []  # nothing to release: the notebook is left alone
    assert learner.read_bytes() == saved

    graded = load_answers(learner)  # and the answers still grade
    for grade_id, source in answers.items():
        name = defined_names(source)[0]
        assert graded.get(name) is not None, grade_id
    assert not (tmp_path / "backups").exists()


def test_release_carries_the_answers_into_a_changed_phase_and_backs_up_the_old_notebook(tmp_path, generated):
    assignment_id = "02_slot_mapping"
    learner = _course_copy(tmp_path, assignment_id, generated)
    answers = _solutions(assignment_id)
    _work_as_in_jupyterlab(learner, answers)
    saved = learner.read_bytes()
    source_path = tmp_path / "solutions" / assignment_id / f"{assignment_id}.ipynb"
    source = read_notebook(source_path)  # the instructor fixes a typo in the deep dive
    source.cells[0].source += "\n\nErratum: a new sentence."
    source_path.write_text(notebook_text(source), encoding="utf-8")

    drift = find_drift(tmp_path, [assignment_id])
    assert drift.changed == [(f"phases/{assignment_id}/{assignment_id}.ipynb (cell 'intro': source differs "
                              "from the release)")]
    assert "answers are carried over" in drift.describe()

    (message,) = release(tmp_path, [assignment_id])
    assert f"{len(answers)} answer(s) carried over" in message, message
    assert "a cell you added" in message and "f3c1a9d2-learner" in message, message
    backup = tmp_path / message.split("the old file is in ")[1].rstrip(")")
    assert backup.read_bytes() == saved  # everything as the learner had it, scratch cell included

    regenerated = read_notebook(learner)
    assert "Erratum: a new sentence." in regenerated.cells[0].source
    kept = {c.metadata["nbgrader"]["grade_id"]: c.source
            for c in regenerated.cells if c.metadata.get("nbgrader", {}).get("solution")}
    assert kept == answers
    assert find_drift(tmp_path, [assignment_id]).is_clean()
    assert release(tmp_path, [assignment_id]) == []  # a second release changes nothing


def test_release_carries_the_answers_of_a_renumbered_phase_into_its_new_notebook(tmp_path, generated):
    """The capstone moved from 14 to 17 when phases were added before it: a learner's answers follow their
    grade ids into the new notebook, and the old one is backed up before it is deleted."""
    assignment_id = "17_capstone"
    learner = _course_copy(tmp_path, assignment_id, generated)
    answers = _solutions(assignment_id)
    _work_as_in_jupyterlab(learner, answers)
    old = tmp_path / "phases" / "14_capstone" / "14_capstone.ipynb"  # where the earlier numbering kept it
    old.parent.mkdir(parents=True)
    learner.rename(old)
    learner.parent.rmdir()
    saved = old.read_bytes()

    changed = release(tmp_path)
    (created,) = [m for m in changed if m.startswith(f"phases/{assignment_id}/{assignment_id}.ipynb")]
    assert f"{len(answers)} answer(s) carried over from phases/14_capstone/14_capstone.ipynb" in created, created
    (deleted,) = [m for m in changed if m.startswith("phases/14_capstone/")]
    assert f"its answers are now in phases/{assignment_id}/{assignment_id}.ipynb" in deleted, deleted
    backup = tmp_path / deleted.split("a copy is in ")[1].split(";")[0]
    assert backup.read_bytes() == saved and not old.exists()

    kept = {c.metadata["nbgrader"]["grade_id"]: c.source
            for c in read_notebook(learner).cells if c.metadata.get("nbgrader", {}).get("solution")}
    assert kept == answers
    assert find_drift(tmp_path).is_clean()


def test_an_older_releases_untouched_stub_is_replaced_not_carried(tmp_path, generated):
    """An author rewrites an exercise's docstring: the learner's untouched stub of the old release is not their
    work, so `release` writes the new stub instead of carrying the old one over (and needs no backup)."""
    assignment_id = "02_slot_mapping"
    learner = _course_copy(tmp_path, assignment_id, generated)
    source_path = tmp_path / "solutions" / assignment_id / f"{assignment_id}.ipynb"
    source = read_notebook(source_path)
    answer = next(c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "answer-positions")
    first_line_of_docstring = answer.source.split('"""')[1].splitlines()[0]
    answer.source = answer.source.replace(first_line_of_docstring, "A docstring the new release rewrote.", 1)
    source_path.write_text(notebook_text(source), encoding="utf-8")

    (message,) = release(tmp_path, [assignment_id])
    assert "backups" not in message and "NOT carried" not in message, message
    regenerated = {c.metadata["nbgrader"]["grade_id"]: c.source
                   for c in read_notebook(learner).cells if c.metadata.get("nbgrader", {}).get("solution")}
    assert "A docstring the new release rewrote." in regenerated["answer-positions"]
    assert not (tmp_path / "backups").exists()


@pytest.mark.parametrize(("source", "stub"), [
    ('def f(x):\n    """Doc."""\n    # YOUR CODE HERE\n    raise NotImplementedError()', True),
    (('class K:\n    def m(self):\n        raise NotImplementedError()\n    def n(self):\n        "d"\n'
     '        raise NotImplementedError()'), True),
    ('# YOUR CODE HERE\nraise NotImplementedError()\nclass Thing:\n    pass', True),
    ('def f(x):\n    return x + 1', False),
    ('def f(x):\n    y = 1\n    raise NotImplementedError()', False),
    ('def f(x):\n    raise NotImplementedError()\nHELPER = 3', False),
])
def test_an_untouched_stub_is_told_from_an_answer(source, stub):
    from labs.course.release import is_untouched_stub

    assert is_untouched_stub(source) is stub


def _open_in_jupyterlab(path: Path, answers: dict[str, str]) -> None:
    """What opening a notebook in JupyterLab and filling an answer does to the file: its kernelspec (the
    installed kernel's display name) and language_info rewritten, the answer cells' sources replaced."""
    notebook = read_notebook(path)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                       "name": "python3"}
    notebook.metadata["language_info"] = JUPYTERLAB_LANGUAGE_INFO
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def test_a_learners_work_in_phases_never_fails_the_tests_of_the_release(tmp_path, generated):
    """Issue 26: one answer filled in and the metadata rewritten the JupyterLab way, in a COPY of phases/. `check`
    calls it the learner's work, not drift; `release` leaves it alone; and what the release
    tests grade and assemble (`write_release`: the release as generated) is still all stubs, all reference."""
    from labs import assemble
    from labs.checks.common import NotImplementedYet
    from labs.course.__main__ import main

    assignment_id = "01_paged_kv"
    course = tmp_path / "course"
    ours = {k: v for k, v in generated.items() if k.startswith(f"phases/{assignment_id}/")}
    shutil.copytree(REPO_ROOT / "solutions" / assignment_id, course / "solutions" / assignment_id)
    write_release(course, expected=ours)  # a copy of phases/ as released, then the learner opens it in JupyterLab
    learner = course / "phases" / assignment_id / f"{assignment_id}.ipynb"
    _open_in_jupyterlab(learner, {"answer-get-new-blocks": _solutions(assignment_id)["answer-get-new-blocks"]})
    saved = learner.read_bytes()

    drift = find_drift(course, [assignment_id], expected=ours)
    assert drift.is_clean(), drift.describe()
    assert any(w.startswith(f"phases/{assignment_id}/") and "answer-get-new-blocks" in w and "metadata" in w
               for w in drift.learner_work), drift.learner_work
    assert main(["check", assignment_id, "--root", str(course)]) == 0
    assert release(course, [assignment_id]) == [] and learner.read_bytes() == saved

    released = write_release(tmp_path / "release", [assignment_id], root=course)  # what the release tests grade
    for relative, content in ours.items():
        assert (released.parent / relative).read_bytes() == content, relative
    graded = load_answers(released / assignment_id / f"{assignment_id}.ipynb")
    from labs.checks import p01

    for exercise in p01.PHASE.exercises:  # the untouched release: every lab "not implemented yet"
        with pytest.raises(NotImplementedYet, match="not implemented yet"):
            exercise.check(graded.get(exercise.name), seeds=range(1))
    parts = assemble(released)  # and it assembles into the reference engine
    mine = [c for c in parts.report if c.exercise in {e.name for e in p01.PHASE.exercises}]
    assert mine and all(c.status == "reference (untouched)" for c in mine), mine
    assert parts.learner == []

    learners_parts = assemble(course / "phases")  # while the learner's copy has their answer plugged
    assert [c.exercise for c in learners_parts.learner] == ["get_new_blocks"]


def test_notebook_kernelspec_is_the_kernel_setup_installs():
    """scripts/setup.sh installs the course's kernel; JupyterLab then saves its display name into every
    notebook opened, so the notebooks name the same one."""
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    match = re.search(r"ipykernel install .*--name (\S+) --display-name \"([^\"]+)\"", setup)
    assert match, "scripts/setup.sh installs an ipykernel"
    assert (match.group(1), match.group(2)) == (KERNELSPEC["name"], KERNELSPEC["display_name"])
