"""Which pages the site has, in which order: the README as the home page, every phase (from its learner
notebook in phases/, never from solutions/), then every guide in docs/."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What a phase needs beyond a CPU; every other phase runs on any CPU, offline.
PHASE_NEEDS = {
    "07": "its kernel labs run Triton's interpreter, which needs Linux x86_64; no GPU is needed",
}
CPU_ONLY = "runs on any CPU, offline; no GPU is needed"

# Guides in reading order; any other docs/*.md follows, by name.
GUIDE_ORDER = ["index", "setup", "learners", "instructors", "authoring", "using-the-engine", "structured-output",
               "speculative-decoding", "serving", "lora", "across-processes", "models", "engine-internals", "gpu",
               "testing", "benchmarks", "book"]


@dataclass(frozen=True, slots=True)
class Page:
    kind: str          # "home" | "phase" | "guide"
    source: Path       # README.md, phases/NN_topic/NN_topic.ipynb, docs/name.md
    url: str           # path in the site: index.html, phases/NN_topic.html, docs/name.html
    title: str
    needs: str = ""    # a phase's hardware note (the "run it yourself" box)

    @property
    def depth(self) -> int:
        return self.url.count("/")

    @property
    def root(self) -> str:
        """Relative path from this page to the site's root."""
        return "../" * self.depth


def _notebook_title(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"]).splitlines()[0] if cells else path.stem
    return first.lstrip("#").strip()


def _markdown_title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def phase_pages(root: Path = ROOT) -> list[Page]:
    pages = []
    for folder in sorted(p for p in (root / "phases").iterdir() if p.is_dir() and p.name[:2].isdigit()):
        notebook = folder / f"{folder.name}.ipynb"
        if notebook.exists():
            pages.append(Page("phase", notebook, f"phases/{folder.name}.html", _notebook_title(notebook),
                              PHASE_NEEDS.get(folder.name[:2], CPU_ONLY)))
    return pages


def guide_pages(root: Path = ROOT) -> list[Page]:
    found = {p.stem: p for p in (root / "docs").glob("*.md")}
    names = [n for n in GUIDE_ORDER if n in found] + sorted(set(found) - set(GUIDE_ORDER))
    return [Page("guide", found[n], f"docs/{n}.html", _markdown_title(found[n])) for n in names]


def all_pages(root: Path = ROOT) -> list[Page]:
    home = Page("home", root / "README.md", "index.html", "mini")
    return [home, *phase_pages(root), *guide_pages(root)]


def site_url_of(source: Path, root: Path = ROOT) -> str | None:
    """The site URL of a repository file that has a page (README.md, docs/*.md, a phase notebook), else None."""
    try:
        relative = source.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    parts = relative.parts
    if parts == ("README.md",):
        return "index.html"
    if len(parts) == 2 and parts[0] == "docs" and relative.suffix == ".md":
        return f"docs/{relative.stem}.html"
    if len(parts) == 3 and parts[0] == "phases" and relative.suffix == ".ipynb":
        return f"phases/{parts[1]}.html"
    if len(parts) == 2 and parts[0] == "phases":
        return f"phases/{parts[1]}.html"
    return None
