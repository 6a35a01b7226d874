"""Run one notebook the way JupyterLab runs it, and report what happened (used by tests/course/test_notebooks.py).

    python tests/course/learner_kernel.py NOTEBOOK.ipynb REPORT.json

A fresh `python3` kernel (the kernelspec set-up installs), the notebook's own folder as working directory,
cells top to bottom, stopping at the first cell that raises (JupyterLab's "Run All" stops there too). The
test that starts this script gives it a learner's environment: no `MINI_*` variable, no pytest plumbing.
The report: how many code cells ran, the id, error name and message of the cell that stopped the run (if
any), and the text each cell printed, by cell id.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

CELL_TIMEOUT_S = 900  # a guard against a kernel that never answers, far above any cell's CPU need


def main(notebook_path: str, report_path: str) -> None:
    path = Path(notebook_path).resolve()
    notebook = nbformat.read(str(path), as_version=4)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    stopped = None
    with contextlib.suppress(CellExecutionError):
        client.execute()
    ran = 0
    printed: dict[str, str] = {}
    for cell in notebook.cells:
        if cell.cell_type != "code" or cell.get("execution_count") is None:
            continue
        ran += 1
        printed[cell.id] = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        for output in cell.outputs:
            if output.output_type == "error" and stopped is None:
                stopped = {"cell": cell.id, "ename": output.ename, "evalue": output.evalue,
                           "traceback": "\n".join(output.traceback)[-4000:]}
    Path(report_path).write_text(json.dumps({"cells_run": ran, "stopped": stopped, "printed": printed}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
