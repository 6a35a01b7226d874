"""A learner notebook (phases/NN_topic/NN_topic.ipynb) -> HTML for its page.

Executed: every cell before the Lab (the setup cell, the Deep dive's cells and the Mini build), once, in a
fresh kernel, in a copy of the phase's folder (nothing is written into the repository). The executed cells
are cached under the build's cache folder, keyed by the notebook and every source file of mini/ and labs/,
so a rebuild with nothing changed executes nothing. The Lab and what follows are shown as the learner gets
them, unexecuted. Never read: solutions/.

A widget output shows its `text/plain`, which for the course's widgets is the widget's text twin
(labs/views/text_view.py); the picture beside it is the matplotlib figure the Mini build draws. A live widget
needs a kernel and a widget manager; a static page has neither.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import html
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from book.markdown import highlight_code, render
from book.pages import ROOT

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LAB_HEADING = "## 3."


def lab_index(notebook) -> int:
    """Index of the first cell of the Lab: its heading, or the first nbgrader answer or test cell if that comes
    first (the cells before it are executed; no answer cell ever is)."""
    for index, cell in enumerate(notebook.cells):
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if grading.get("solution") or grading.get("grade"):
            return index
        if cell.cell_type == "markdown" and any(line.startswith(LAB_HEADING) for line in cell.source.splitlines()):
            return index
    return len(notebook.cells)


def cache_key(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes())
    for folder in ("mini", "labs"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            digest.update(str(source.relative_to(ROOT)).encode() + source.read_bytes())
    return digest.hexdigest()[:16]


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


def execute_mini_build(path: Path, cache_dir: Path):
    """The notebook with every cell before the Lab executed (from the cache when it is current)."""
    notebook = nbformat.read(path, as_version=4)
    cached = cache_dir / f"{path.stem}-{cache_key(path)}.ipynb"
    if cached.exists():
        return nbformat.read(cached, as_version=4)
    from nbclient import NotebookClient

    head = copy.deepcopy(notebook)
    head.cells = notebook.cells[:lab_index(notebook)]
    with tempfile.TemporaryDirectory(prefix=f"book-{path.stem}-") as work:
        folder = Path(work) / path.parent.name
        shutil.copytree(path.parent, folder)
        with this_interpreter_as_kernel(Path(work) / "jupyter"):
            NotebookClient(head, timeout=None, kernel_name="python3",
                           resources={"metadata": {"path": str(folder)}}).execute()
    notebook.cells[:len(head.cells)] = head.cells
    cache_dir.mkdir(parents=True, exist_ok=True)
    for stale in cache_dir.glob(f"{path.stem}-*.ipynb"):
        stale.unlink()
    nbformat.write(notebook, cached)
    return notebook


def _output_html(output, images: list[tuple[str, bytes]], name: str) -> str:
    kind = output.output_type
    if kind == "stream":
        css = "stream stderr" if output.name == "stderr" else "stream"
        return f'<pre class="output {css}">{html.escape(output.text)}</pre>'
    if kind == "error":
        return f'<pre class="output error">{html.escape(output.ename + ": " + output.evalue)}</pre>'
    data = output.get("data", {})
    if "image/png" in data and WIDGET_MIME not in data:
        import base64

        filename = f"{name}-{len(images)}.png"
        images.append((filename, base64.b64decode(data["image/png"])))
        return f'<img class="output" src="img/{filename}" alt="figure {len(images)} of {name}">'
    if "text/html" in data and WIDGET_MIME not in data:
        return f'<div class="output html">{data["text/html"]}</div>'
    if "text/plain" in data:
        css = "output widget-text" if WIDGET_MIME in data else "output"
        return f'<pre class="{css}">{html.escape(data["text/plain"])}</pre>'
    return ""


def render_notebook(notebook, source: Path, page_root: str) -> tuple[str, list, list[tuple[str, bytes]]]:
    """(HTML, headings, images) of a notebook; images are (file name under img/, PNG bytes)."""
    parts, headings, images = [], [], []
    # Anchors are made over all markdown cells at once, so repeated headings get GitHub's -1, -2 suffixes.
    text = "".join(cell.source + "\n\n" for cell in notebook.cells if cell.cell_type == "markdown")
    _, all_headings = render(text, source, page_root)
    slugs = iter(all_headings)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell_html, cell_headings = render(cell.source, source, page_root)
            for level, slug, title in cell_headings:
                _, unique, _ = next(slugs)
                cell_html = cell_html.replace(f'id="{slug}"', f'id="{unique}"', 1).replace(
                    f'href="#{slug}"', f'href="#{unique}"', 1)
                headings.append((level, unique, title))
            parts.append(f'<div class="cell markdown">{cell_html}</div>')
        elif cell.cell_type == "code":
            grade = cell.get("metadata", {}).get("nbgrader", {})
            label = " answer" if grade.get("solution") else (" test" if grade.get("grade") else "")
            code = highlight_code(cell.source, "python")
            outputs = "".join(_output_html(o, images, source.stem) for o in cell.get("outputs", []))
            parts.append(f'<div class="cell code{label}"><pre class="code"><code>{code}</code></pre>{outputs}</div>')
    return "\n".join(parts), headings, images
