"""Mirrors no vllm/v1 file: regenerate the learner notebooks in phases/ from solutions/ with nbgrader.

`release()` runs nbgrader's `generate_assignment` for every phase in a scratch course root (so the
repository never gets a gradebook or stray files), normalizes the result (see notebook_format) and
writes it to `phases/`. `find_drift()` does the same into memory and lists what differs.
`write_release()` writes the release as generated into another folder: the project's tests of the release
test that, never the learner's working copy in phases/.

phases/ is also where learners work, so neither command may cost them their work:

- the drift check compares only what the release controls: the cells the release wrote (matched by
  cell id, in order), their type, their nbgrader metadata and their source, except the source of answer
  cells. Kernel and language metadata (JupyterLab rewrites both on save), outputs, the learner's
  answers and cells the learner added are theirs and never count as drift (`Drift.learner_work` lists
  them, for information); a changed notebook is named with the first cell that differs;
- `release()` leaves a phase notebook alone when nothing the release controls changed. When something
  did, it writes the new release with the learner's answers CARRIED OVER (answer cells matched by grade
  id), and first copies the old file to `backups/<time>/phases/...` if it held any work of the learner's
  (filled answers, added cells, outputs); what could not be carried (an answer cell the new release no
  longer has, an added cell) is named in the returned messages. Files it deletes from phases/ are backed
  up the same way. A phase that was renumbered or renamed (`14_capstone` -> `17_capstone`) keeps its
  exercises' grade ids: the answers of the old notebook are carried into the new one by grade id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat

from labs.course.notebook_format import notebook_text, read_notebook, write_normalized

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")
BACKUP_DIR = "backups"  # under the course root, git-ignored: what release() replaced or deleted in phases/


@dataclass(slots=True)
class Drift:
    """What differs between phases/ and what nbgrader generates from solutions/.

    `learner_work` names the notebooks that differ from the release only by the learner's own edits
    (answers, outputs, kernel metadata, added cells): listed for information, never drift."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # generated but absent from phases/
    extra: list[str] = field(default_factory=list)  # in phases/ but not generated
    learner_work: list[str] = field(default_factory=list)  # "path (what is the learner's)": not drift

    def is_clean(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def describe(self) -> str:
        work = [f"your work (not drift): {p}" for p in self.learner_work]
        if self.is_clean():
            return "\n".join(["phases/ is in sync with solutions/", *work])
        lines = [f"changed: {p}" for p in self.changed]
        lines += [f"missing: {p}" for p in self.missing] + [f"extra:   {p}" for p in self.extra]
        return "\n".join(lines + work) + (
            "\nrun `python -m labs.course release` to regenerate phases/ (your answers are carried over; "
            f"anything it replaces or deletes is first copied to {BACKUP_DIR}/)"
        )


def list_assignments(root: Path = REPO_ROOT) -> list[str]:
    """Assignment ids NN_topic that have a source notebook solutions/NN_topic/NN_topic.ipynb."""
    source = root / "solutions"
    if not source.is_dir():
        return []
    return sorted(
        d.name
        for d in source.iterdir()
        if d.is_dir() and ASSIGNMENT_NAME.match(d.name) and (d / f"{d.name}.ipynb").is_file()
    )


def _nbgrader_config(course_root: Path):
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO_ROOT)).load_config()
    config.CourseDirectory.root = str(course_root)
    config.CourseDirectory.db_url = f"sqlite:///{course_root / 'gradebook.db'}"
    (course_root / "exchange").mkdir(parents=True, exist_ok=True)
    config.Exchange.root = str(course_root / "exchange")  # nbgrader's default lives outside the course
    return config


class CourseToolsMissing(RuntimeError):
    """nbgrader's command-line helpers (`alembic`) cannot be found: the course's environment is not active."""


def _ensure_course_tools() -> None:
    """nbgrader runs the `alembic` command to create its gradebook. Started as `.venv/bin/python -m labs.course`
    without activating the environment, that command is not on PATH: put this interpreter's bin/ first. If it
    is still missing, say how to run the course's commands instead of letting nbgrader die on it."""
    if shutil.which("alembic"):
        return
    bin_dir = str(Path(sys.executable).parent)
    if (Path(bin_dir) / "alembic").exists():
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        return
    raise CourseToolsMissing(
        "the `alembic` command that nbgrader needs is not on PATH: this Python "
        f"({sys.executable}) is not the course's environment. Activate it first (`. .venv/bin/activate`, "
        "made by `bash scripts/setup.sh`), or run the command with its Python: "
        "`.venv/bin/python -m labs.course ...`"
    )


def generate_assignment(course_root: Path, assignment_id: str) -> None:
    """Run nbgrader generate_assignment in `course_root` (its solutions/ -> its phases/)."""
    _ensure_course_tools()
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = _nbgrader_config(course_root)
    coursedir = CourseDirectory(config=config)
    api = NbGraderAPI(coursedir=coursedir, config=config)
    result = api.generate_assignment(assignment_id, force=True, create=True)
    if not result["success"]:
        raise RuntimeError(f"nbgrader generate_assignment {assignment_id} failed:\n{result['log']}")


def normalize_sources(root: Path = REPO_ROOT, assignment_ids: list[str] | None = None) -> list[str]:
    """Normalize the solutions/ notebooks in place (all, or the given phases); return those that changed."""
    changed = []
    for assignment_id in list_assignments(root) if assignment_ids is None else assignment_ids:
        path = root / "solutions" / assignment_id / f"{assignment_id}.ipynb"
        if write_normalized(read_notebook(path), path):
            changed.append(str(path.relative_to(root)))
    return changed


def generated_files(assignment_ids: list[str] | None = None, root: Path = REPO_ROOT) -> dict[str, bytes]:
    """{path relative to root: content} of what phases/ must hold, generated in a scratch course."""
    ids = list_assignments(root) if assignment_ids is None else assignment_ids
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="mini-course-") as scratch_dir:
        scratch = Path(scratch_dir)
        for assignment_id in ids:
            shutil.copytree(
                root / "solutions" / assignment_id,
                scratch / "solutions" / assignment_id,
                ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
            )
            generate_assignment(scratch, assignment_id)
            released = scratch / "phases" / assignment_id
            for path in sorted(p for p in released.rglob("*") if p.is_file()):
                relative = str(Path("phases") / assignment_id / path.relative_to(released))
                if path.suffix == ".ipynb":
                    files[relative] = notebook_text(read_notebook(path)).encode("utf-8")
                else:
                    files[relative] = path.read_bytes()
    return files


def write_release(target: Path, assignment_ids: list[str] | None = None, root: Path = REPO_ROOT,
                  expected: dict[str, bytes] | None = None) -> Path:
    """Write the release AS GENERATED (what phases/ holds in a fresh clone) under `target`; return target/phases.

    Tests of the release use this, never the phases/ of the checkout: learners work there (answers, outputs,
    kernel metadata), and their work must not fail the project's tests. `expected` is
    `generated_files(...)` when the caller already has it."""
    if expected is None:
        expected = generated_files(assignment_ids, root=root)
    for relative, content in expected.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (target / "phases").mkdir(parents=True, exist_ok=True)
    return target / "phases"


def _phase_files(root: Path, assignment_ids: list[str] | None = None) -> set[str]:
    phases = root / "phases"
    if not phases.is_dir():
        return set()
    return {
        str(p.relative_to(root))
        for p in phases.rglob("*")
        if p.is_file()
        and ".ipynb_checkpoints" not in p.parts
        and "__pycache__" not in p.parts
        and (assignment_ids is None or p.relative_to(phases).parts[0] in assignment_ids)
    }


# ---------------------------------------------------------------- what the release controls in a notebook


def _is_answer_cell(cell: Any) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution", False))


def _answer_id(cell: Any) -> str:
    return str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or cell.get("id", ""))


def _source(cell: Any) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _controlled_cell(cell: Any) -> tuple:
    """One released cell as the release controls it: id, type, nbgrader metadata, source (not for answers)."""
    nbgrader_meta = json.dumps(cell.get("metadata", {}).get("nbgrader", {}), sort_keys=True)
    source = None if _is_answer_cell(cell) else _source(cell)
    return (cell.get("id"), cell.get("cell_type"), nbgrader_meta, source)


def _read_bytes_as_notebook(content: bytes) -> nbformat.NotebookNode | None:
    try:
        return nbformat.reads(content.decode("utf-8"), as_version=4)
    except Exception:  # noqa: BLE001 - a notebook that does not parse has simply drifted
        return None


def _learner_cells(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[Any]:
    released_ids = {cell.get("id") for cell in released.cells}
    return [cell for cell in present.cells if cell.get("id") not in released_ids]


def same_release(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> bool:
    """True when `present` holds exactly the cells `released` has, as far as the release controls them.

    Cells the learner added (ids the release does not have) are ignored, as are answer cell sources,
    outputs, execution counts, other cell metadata and the notebook's metadata (kernelspec, language_info).
    """
    released_ids = {cell.get("id") for cell in released.cells}
    kept = [_controlled_cell(cell) for cell in present.cells if cell.get("id") in released_ids]
    return kept == [_controlled_cell(cell) for cell in released.cells]


def is_untouched_stub(source: str) -> bool:
    """True for an answer cell as some release wrote it and nobody filled it: every function body is an optional
    docstring and `raise NotImplementedError()` (nbgrader's stub), and nothing else runs. The stub of an older
    release counts too (its docstring may differ from today's), so `release` replaces it instead of carrying it
    over as if it were the learner's answer."""
    import ast

    if "NotImplementedError" not in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False

    def is_docstring(node: ast.stmt) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)

    def is_stub_raise(node: ast.stmt) -> bool:
        target = node.exc.func if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) else getattr(
            node, "exc", None)
        return isinstance(node, ast.Raise) and getattr(target, "id", None) == "NotImplementedError"

    def untouched(body: list[ast.stmt], allow_defs: bool) -> bool:
        statements = body[1:] if body and is_docstring(body[0]) else body
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and allow_defs:
                if not untouched(node.body, allow_defs=False):
                    return False
            elif isinstance(node, ast.ClassDef) and allow_defs:
                if not untouched(node.body, allow_defs=True):
                    return False
            elif not (is_stub_raise(node) or isinstance(node, ast.Pass)):
                return False
        return True

    return untouched(tree.body, allow_defs=True)


def _filled_answers(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> dict[str, str]:
    """{answer grade id: the learner's source} for every answer cell of `present` that is not a stub (today's,
    or an older release's that nobody filled)."""
    stubs = {_answer_id(cell): _source(cell) for cell in released.cells if _is_answer_cell(cell)}
    return {
        _answer_id(cell): _source(cell)
        for cell in present.cells
        if _is_answer_cell(cell) and _source(cell) != stubs.get(_answer_id(cell))
        and not is_untouched_stub(_source(cell))
    }


def _holds_learner_work(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> bool:
    has_outputs = any(cell.get("outputs") for cell in present.cells)
    return bool(_filled_answers(present, released) or _learner_cells(present, released) or has_outputs)


def learner_edits(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[str]:
    """What in `present` is the learner's, not the release's: filled answers, added cells, outputs, metadata."""
    edits = []
    answers = _filled_answers(present, released)
    if answers:
        edits.append(f"{len(answers)} answer(s) filled in ({', '.join(sorted(answers))})")
    added = _learner_cells(present, released)
    if added:
        edits.append(f"{len(added)} cell(s) added")
    if any(cell.get("outputs") or cell.get("execution_count") for cell in present.cells):
        edits.append("outputs")
    if present.get("metadata", {}) != released.get("metadata", {}):
        edits.append("notebook metadata (kernelspec, language_info: JupyterLab writes them)")
    return edits or ["formatting only"]


def _notebook_drift(path: Path, content: bytes) -> tuple[bool, list[str]]:
    """(drifted, the learner's edits) of the notebook at `path` against its release `content`."""
    if path.read_bytes() == content:
        return False, []
    present = _read_bytes_as_notebook(path.read_bytes())
    released = _read_bytes_as_notebook(content)
    if present is None or released is None:
        return True, ["does not parse as a notebook"]
    difference = release_difference(present, released)
    if difference is not None:
        return True, [difference]
    return False, learner_edits(present, released)


def release_difference(present: nbformat.NotebookNode, released: nbformat.NotebookNode) -> str | None:
    """The first cell where `present` differs from `released` in what the release controls (None: same release)."""
    if same_release(present, released):
        return None
    released_ids = {cell.get("id") for cell in released.cells}
    kept = [cell for cell in present.cells if cell.get("id") in released_ids]
    for index, cell in enumerate(released.cells):
        if index >= len(kept):
            return f"released cell {cell.get('id')!r} is missing"
        mine = _controlled_cell(kept[index])
        theirs = _controlled_cell(cell)
        if mine != theirs:
            what = ("cell id (cells moved or deleted)" if mine[0] != theirs[0] else
                    "cell type" if mine[1] != theirs[1] else
                    "nbgrader metadata" if mine[2] != theirs[2] else "source")
            return f"cell {cell.get('id')!r}: {what} differs from the release"
    return "cells differ from the release"


def find_drift(
    root: Path = REPO_ROOT, assignment_ids: list[str] | None = None, expected: dict[str, bytes] | None = None
) -> Drift:
    """What differs in phases/ (only under the given assignments, if any) from what the release controls.

    `expected` is `generated_files(...)` when the caller already has it."""
    if expected is None:
        expected = generated_files(assignment_ids, root=root)
    present = _phase_files(root, assignment_ids)
    drift = Drift()
    for relative, content in expected.items():
        if relative not in present:
            drift.missing.append(relative)
        elif relative.endswith(".ipynb"):
            drifted, edits = _notebook_drift(root / relative, content)
            if drifted:
                drift.changed.append(f"{relative} ({edits[0]})")
            elif edits:
                drift.learner_work.append(f"{relative} ({'; '.join(edits)})")
        elif (root / relative).read_bytes() != content:
            drift.changed.append(relative)
    drift.extra = sorted(present - set(expected))
    return drift


# ---------------------------------------------------------------- release: regenerate, keep the learner's work


def _backup(root: Path, relative: str, stamp: str) -> str:
    """Copy root/relative to root/backups/<stamp>/relative; return the backup's path relative to root."""
    target = root / BACKUP_DIR / stamp / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / relative, target)
    return str(target.relative_to(root))


def _put_answers(released: nbformat.NotebookNode, answers: dict[str, str]) -> list[str]:
    """Give each answer cell of `released` whose grade id is in `answers` that source (in place); the grade ids
    put in."""
    carried = []
    for cell in released.cells:
        if _is_answer_cell(cell) and _answer_id(cell) in answers:
            cell.source = answers[_answer_id(cell)]
            carried.append(_answer_id(cell))
    return carried


def _carry_answers(present: nbformat.NotebookNode, content: bytes) -> tuple[bytes, list[str], list[str]]:
    """The new release `content` with the learner's answers of `present` put back into their cells.

    Returns (content, grade ids carried over, what could not be carried)."""
    released = nbformat.reads(content.decode("utf-8"), as_version=4)
    answers = _filled_answers(present, released)
    carried = _put_answers(released, answers)
    lost = [f"answer cell {grade_id!r} (not in the new release)" for grade_id in answers if grade_id not in carried]
    lost += [f"a cell you added ({cell.get('cell_type')} cell {cell.get('id')!r})"
             for cell in _learner_cells(present, released)]
    return notebook_text(released).encode("utf-8"), carried, lost


def _answers_of_moved_notebooks(root: Path, stale: list[str]) -> dict[str, tuple[str, str]]:
    """{grade id: (the learner's source, the notebook it is in)} for the filled answers of the phases/ notebooks
    the new release no longer has: a phase that was renumbered (`14_capstone` -> `17_capstone`) keeps its
    exercises' grade ids, so its answers follow them into the new notebook."""
    moved: dict[str, tuple[str, str]] = {}
    empty = nbformat.v4.new_notebook()
    for relative in stale:
        if not relative.endswith(".ipynb"):
            continue
        present = _read_bytes_as_notebook((root / relative).read_bytes())
        if present is not None:
            for grade_id, source in _filled_answers(present, empty).items():
                moved.setdefault(grade_id, (source, relative))
    return moved


def _new_notebook(content: bytes, moved: dict[str, tuple[str, str]]) -> tuple[bytes, dict[str, list[str]]]:
    """A notebook new to phases/, with the answers of a moved notebook whose grade ids it has.

    Returns (content, {old notebook: grade ids carried from it})."""
    released = nbformat.reads(content.decode("utf-8"), as_version=4)
    carried = _put_answers(released, {grade_id: source for grade_id, (source, _) in moved.items()})
    if not carried:
        return content, {}
    origins: dict[str, list[str]] = {}
    for grade_id in carried:
        origins.setdefault(moved[grade_id][1], []).append(grade_id)
    return notebook_text(released).encode("utf-8"), origins


def _release_notebook(root: Path, relative: str, content: bytes, stamp: str) -> str | None:
    """Bring one phases/ notebook up to `content` without losing the learner's work; a message, or None."""
    path = root / relative
    if path.read_bytes() == content:
        return None
    present = _read_bytes_as_notebook(path.read_bytes())
    released = _read_bytes_as_notebook(content)
    if present is None:  # does not parse: keep a copy, write the release
        backup = _backup(root, relative, stamp)
        path.write_bytes(content)
        return f"{relative} (could not be read as a notebook; regenerated, the old file is in {backup})"
    if released is None:
        raise ValueError(f"the release of {relative} does not parse as a notebook")
    if not _holds_learner_work(present, released):
        path.write_bytes(content)  # nothing of the learner's: normalize (kernel metadata, formatting)
        return relative
    if same_release(present, released):
        return None  # only the learner's parts differ: nothing to release, leave their notebook alone
    backup = _backup(root, relative, stamp)
    merged, carried, lost = _carry_answers(present, content)
    path.write_bytes(merged)
    message = f"{relative} (regenerated; {len(carried)} answer(s) carried over"
    if lost:
        message += "; NOT carried over, copy them back from the backup: " + ", ".join(lost)
    return message + f"; the old file is in {backup})"


def release(root: Path = REPO_ROOT, assignment_ids: list[str] | None = None) -> list[str]:
    """Normalize solutions/, regenerate phases/ from it, delete stale files; return what changed.

    The learner's answers are carried into each regenerated notebook, and every file of phases/ that is
    replaced while holding learner work, or deleted, is first copied to backups/<time>/ (see the module
    docstring). With `assignment_ids`, only those phases are touched."""
    changed = normalize_sources(root, assignment_ids)
    expected = generated_files(assignment_ids, root=root)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    stale = sorted(_phase_files(root, assignment_ids) - set(expected))
    moved = _answers_of_moved_notebooks(root, stale)
    carried_to: dict[str, str] = {}  # old notebook -> the new one its answers went to
    for relative, content in expected.items():
        path = root / relative
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            origins = {}
            if relative.endswith(".ipynb"):
                content, origins = _new_notebook(content, moved)
            path.write_bytes(content)
            carried_to.update(dict.fromkeys(origins, relative))
            changed.append(relative + "".join(f" (new; {len(ids)} answer(s) carried over from {old})"
                                              for old, ids in origins.items()))
        elif relative.endswith(".ipynb"):
            message = _release_notebook(root, relative, content, stamp)
            if message is not None:
                changed.append(message)
        elif path.read_bytes() != content:
            backup = _backup(root, relative, stamp)
            path.write_bytes(content)
            changed.append(f"{relative} (replaced; the old file is in {backup})")
    for relative in stale:
        backup = _backup(root, relative, stamp)
        (root / relative).unlink()
        where = f"; its answers are now in {carried_to[relative]}" if relative in carried_to else ""
        changed.append(f"{relative} (deleted; a copy is in {backup}{where})")
    return changed
