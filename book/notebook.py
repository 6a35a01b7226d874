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

import hashlib
import html
import os
import subprocess
import sys
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


def execute_mini_build(path: Path, cache_dir: Path):
    """The notebook with every cell before the Lab executed (from the cache when it is current; else by
    `python -m book.execute` in a process of its own)."""
    cached = cache_dir / f"{path.stem}-{cache_key(path)}.ipynb"
    if not cached.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        for stale in cache_dir.glob(f"{path.stem}-*.ipynb"):
            stale.unlink()
        partial = cached.with_suffix(".partial")
        subprocess.run([sys.executable, "-m", "book.execute", str(path), str(partial)], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
        partial.replace(cached)
    return nbformat.read(cached, as_version=4)


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
