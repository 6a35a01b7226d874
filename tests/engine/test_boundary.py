"""The engine package is the engine: nothing in mini/ imports the course (labs, views, grading, nbgrader,
widgets), and no engine code reaches into sys.modules or patches modules to let the course in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MINI = Path(__file__).resolve().parents[2] / "mini"
COURSE_PACKAGES = ("labs", "nbgrader", "ipywidgets", "IPython", "matplotlib", "nbformat", "nbclient")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_engine_imports_no_course_code():
    offenders = [
        f"{path.relative_to(MINI.parent)} imports {name}"
        for path in sorted(MINI.rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in COURSE_PACKAGES
    ]
    assert not offenders, "mini/ must not import the course:\n" + "\n".join(offenders)


def test_engine_has_no_course_folders_and_no_module_patching():
    assert not (MINI / "viz").exists() and not (MINI / "course").exists() and not (MINI / "labs.py").exists()
    # triton_utils.py re-wraps Triton's OWN language helpers for its CPU interpreter (a third-party fix,
    # documented there); nothing else in the engine may look modules up to patch them.
    for path in sorted(MINI.rglob("*.py")):
        if path.name == "triton_utils.py":
            continue
        source = path.read_text(encoding="utf-8")
        assert "sys.modules" not in source, f"{path.name} scans sys.modules"
