"""Mirrors no vllm/v1 file: regenerate the learner notebooks in phases/ from solutions/ with nbgrader.

`release()` runs nbgrader's `generate_assignment` for every phase in a scratch course root (so the
repository never gets a gradebook or stray files), normalizes the result (see notebook_format) and
writes it to `phases/`. `find_drift()` does the same into memory and lists what differs.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from labs.course.notebook_format import notebook_text, read_notebook, write_normalized

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


@dataclass(slots=True)
class Drift:
    """What differs between phases/ and what nbgrader generates from solutions/."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # generated but absent from phases/
    extra: list[str] = field(default_factory=list)  # in phases/ but not generated

    def is_clean(self) -> bool:
        return not (self.changed or self.missing or self.extra)

    def describe(self) -> str:
        if self.is_clean():
            return "phases/ is in sync with solutions/"
        lines = [f"changed: {p}" for p in self.changed]
        lines += [f"missing: {p}" for p in self.missing] + [f"extra:   {p}" for p in self.extra]
        return "\n".join(lines) + "\nrun `python -m labs.course release` to regenerate phases/"


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


def generate_assignment(course_root: Path, assignment_id: str) -> None:
    """Run nbgrader generate_assignment in `course_root` (its solutions/ -> its phases/)."""
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


def find_drift(root: Path = REPO_ROOT, assignment_ids: list[str] | None = None) -> Drift:
    """What differs in phases/ (only under the given assignments, if any)."""
    expected = generated_files(assignment_ids, root=root)
    present = _phase_files(root, assignment_ids)
    drift = Drift()
    for relative, content in expected.items():
        if relative not in present:
            drift.missing.append(relative)
        elif (root / relative).read_bytes() != content:
            drift.changed.append(relative)
    drift.extra = sorted(present - set(expected))
    return drift


def release(root: Path = REPO_ROOT, assignment_ids: list[str] | None = None) -> list[str]:
    """Normalize solutions/, regenerate phases/ from it, delete stale files; return what changed.

    With `assignment_ids`, only those phases are touched."""
    changed = normalize_sources(root, assignment_ids)
    expected = generated_files(assignment_ids, root=root)
    for relative, content in expected.items():
        path = root / relative
        if not path.exists() or path.read_bytes() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            changed.append(relative)
    for relative in sorted(_phase_files(root, assignment_ids) - set(expected)):
        (root / relative).unlink()
        changed.append(f"{relative} (deleted)")
    return changed
