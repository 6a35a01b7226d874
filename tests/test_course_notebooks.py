"""Every source notebook in solutions/ executes top to bottom without an error (on the python3 kernel,
from its own folder, as a learner or `nbgrader autograde` runs it)."""

from __future__ import annotations

import os

import nbformat
import pytest

from labs.course.release import REPO_ROOT, list_assignments

CELL_TIMEOUT_S = 300


@pytest.mark.parametrize("assignment_id", list_assignments())
def test_solution_notebook_runs_top_to_bottom(assignment_id, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # as tests/conftest.py: one torch thread per parallel worker
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    folder = REPO_ROOT / "solutions" / assignment_id
    notebook = nbformat.read(str(folder / f"{assignment_id}.ipynb"), as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
    plug_cell = next(c for c in notebook.cells if c.id == "plug")
    printed = "".join(o.get("text", "") for o in plug_cell.outputs if o.output_type == "stream")
    assert "same" in printed, "the plug-it-in cell compares with the reference and reports it"
