"""The learner's path: every learner notebook runs as JupyterLab runs it (issue 38).

Each notebook of the release (what `phases/` holds in a fresh clone, generated into a temporary folder) runs in
a fresh `python3` kernel started by a subprocess (tests/course/learner_kernel.py) whose environment has no `MINI_*`
variable and no pytest plumbing (no PYTEST_*, no PYTHONPATH, no thread or offline settings of the suite's),
from the notebook's own folder, top to bottom:

* **answered**: every answer cell holds the solution's code (the whole release answered, so the capstone
  assembles answered notebooks): every cell runs, and each "Plug it in" reports the same output as the
  reference;
* **untouched**: as released, it runs to the first exercise check, which stops with "not implemented yet";
  nothing before it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT, list_assignments, write_release

RUNNER = Path(__file__).resolve().parent / "learner_kernel.py"
# What a learner's shell passes on; nothing of the suite's (MINI_*, PYTEST_*, PYTHONPATH, OMP_NUM_THREADS,
# HF_HUB_OFFLINE, TOKENIZERS_PARALLELISM, MPLBACKEND ...).
LEARNER_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TMPDIR", "SHELL", "VIRTUAL_ENV")


def learner_environment() -> dict[str, str]:
    env = {name: os.environ[name] for name in LEARNER_VARIABLES if name in os.environ}
    bin_dir = str(Path(sys.executable).parent)  # the course's environment, as `. .venv/bin/activate` sets it
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """{"untouched": the release as generated, "answered": the same with every answer cell solved}."""
    untouched = write_release(tmp_path_factory.mktemp("untouched"))
    answered = write_release(tmp_path_factory.mktemp("answered"))
    for assignment_id in list_assignments():
        solution = read_notebook(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")
        solved = {cell.id: cell.source for cell in solution.cells}
        path = answered / assignment_id / f"{assignment_id}.ipynb"
        notebook = read_notebook(path)
        for cell in notebook.cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = solved[cell.id]
        write_normalized(notebook, path)
    return {"untouched": untouched, "answered": answered}


def run_as_learner(notebook: Path, tmp_path: Path) -> dict:
    report = tmp_path / f"{notebook.stem}.json"
    result = subprocess.run([sys.executable, str(RUNNER), str(notebook), str(report)], env=learner_environment(),
                            cwd=notebook.parent, capture_output=True, text=True, check=False)
    assert report.exists(), f"the notebook runner failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(report.read_text())


@pytest.mark.parametrize("assignment_id", list_assignments())
def test_answered_notebook_runs_top_to_bottom_as_a_learner_runs_it(assignment_id, releases, tmp_path):
    notebook = releases["answered"] / assignment_id / f"{assignment_id}.ipynb"
    report = run_as_learner(notebook, tmp_path)
    stopped = report["stopped"]
    assert stopped is None, (f"{assignment_id} stopped at cell {stopped['cell']}: {stopped['ename']}: "
                             f"{stopped['evalue']}\n{stopped['traceback']}")
    code_cells = sum(cell.cell_type == "code" for cell in read_notebook(notebook).cells)
    assert report["cells_run"] == code_cells
    plug_output = report["printed"].get("plug", "")
    assert "same" in plug_output, f"the Plug it in cell does not report the reference's output:\n{plug_output}"


@pytest.mark.parametrize("assignment_id", list_assignments())
def test_untouched_notebook_runs_to_its_first_check(assignment_id, releases, tmp_path):
    notebook = releases["untouched"] / assignment_id / f"{assignment_id}.ipynb"
    cells = read_notebook(notebook).cells
    first_check = next(c.id for c in cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"))
    report = run_as_learner(notebook, tmp_path)
    stopped = report["stopped"]
    assert stopped is not None, "an untouched notebook cannot pass its first exercise check"
    assert stopped["cell"] == first_check and stopped["ename"] == "NotImplementedYet", (
        f"{assignment_id} stopped before its first exercise check ({first_check}), at cell {stopped['cell']}: "
        f"{stopped['ename']}: {stopped['evalue']}\n{stopped['traceback']}")
    assert "not implemented yet" in stopped["evalue"]
