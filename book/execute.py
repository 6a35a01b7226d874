"""Execute a learner notebook's cells before the Lab, in a process of its own:
`python -m book.execute NOTEBOOK OUT.ipynb` (book/notebook.py runs it once per phase).

One process per notebook, one kernel per process, over IPC sockets: a kernel client that has run a dozen
kernels in one process, each on TCP ports, once waited for a reply that never came; a fresh process with
its own sockets leaves nothing behind for the next phase. The kernel is this interpreter
(`this_interpreter_as_kernel`), and it runs in a copy of the phase's folder, so nothing is written into the
repository.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from book.notebook import lab_index


@contextlib.contextmanager
def this_interpreter_as_kernel(work: Path):
    """The `python3` kernel is this interpreter (the environment that builds the book), whatever kernelspec
    another environment registered for the user: JUPYTER_PATH is searched first."""
    spec = work / "kernels" / "python3"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}), encoding="utf-8")
    before = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(work), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = before


def execute(source: Path, out: Path) -> None:
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    # Figures drawn inline, as in JupyterLab, whatever backend the builder's environment names (an
    # MPLBACKEND=Agg inherited by the kernel would draw every figure nowhere).
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"

    notebook = nbformat.read(source, as_version=4)
    head = copy.deepcopy(notebook)
    head.cells = notebook.cells[:lab_index(notebook)]
    with tempfile.TemporaryDirectory(prefix=f"book-{source.stem}-") as work:
        folder = Path(work) / source.parent.name
        shutil.copytree(source.parent, folder)
        with this_interpreter_as_kernel(Path(work) / "jupyter"):
            manager = KernelManager(kernel_name="python3", transport="ipc",
                                    connection_file=str(Path(work) / "kernel.json"), ip=str(Path(work) / "k"))
            NotebookClient(head, km=manager, timeout=None, resources={"metadata": {"path": str(folder)}}).execute()
    notebook.cells[:len(head.cells)] = head.cells
    nbformat.write(notebook, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.splitlines()[1], file=sys.stderr)
        sys.exit(2)
    execute(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
