"""Static checks of a built site, shared by the build test and the browser test: the pages it must have,
its internal links and anchors, and that no solution code reached it."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from book.pages import ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MIN_LINE = 20   # shorter solution lines ("return x", "pass") say nothing about where they came from


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("img", "script") and attrs.get("src"):
            self.sources.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.sources.append(attrs["href"])


def parse(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(encoding="utf-8"))
    return collector


def broken_links(site: Path) -> list[str]:
    """Every internal href, src and #anchor of every page that does not resolve inside the site."""
    pages = {path.resolve(): parse(path) for path in site.rglob("*.html")}
    broken, site = [], site.resolve()
    for path, page in pages.items():
        for ref in page.links + page.sources:
            parts = urlsplit(ref)
            if parts.scheme or ref.startswith("//"):
                if parts.scheme not in ("data", "mailto", "http", "https"):
                    broken.append(f"{path.relative_to(site)}: {ref}: unexpected scheme")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
            if not target.exists() or site.resolve() not in [target, *target.parents]:
                broken.append(f"{path.relative_to(site)}: {ref}: no such file in the site")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in pages[target].ids:
                broken.append(f"{path.relative_to(site)}: {ref}: no such anchor")
    return broken


def solution_blocks(root: Path = ROOT) -> dict[str, list[str]]:
    """{notebook: [the code of each answer cell between BEGIN and END SOLUTION]} from solutions/."""
    blocks: dict[str, list[str]] = {}
    for notebook in sorted((root / "solutions").glob("*/*.ipynb")):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            for match in re.finditer(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), source, re.DOTALL):
                blocks.setdefault(notebook.parent.name, []).append(match.group(1))
    return blocks


def page_lines(page: Path) -> set[str]:
    """The stripped text lines of a built page (tags dropped, entities decoded)."""
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
    return {line.strip() for line in text.splitlines()}


def distinctive_solution_lines(root: Path = ROOT) -> dict[str, list[str]]:
    """{phase: the lines of its solution code (at least MIN_LINE long) that its learner notebook does not hold
    itself; a line such as `for block in blocks:` may well appear in the Mini build's own code}."""
    lines: dict[str, list[str]] = {}
    for phase, blocks in solution_blocks(root).items():
        learner = (root / "phases" / phase / f"{phase}.ipynb").read_text(encoding="utf-8")
        learner_lines = {line.strip() for cell in json.loads(learner)["cells"]
                         for line in "".join(cell["source"]).splitlines()}
        lines[phase] = [line.strip() for block in blocks for line in block.splitlines()
                        if len(line.strip()) >= MIN_LINE and line.strip() not in learner_lines]
    return lines


def leaked_solution_lines(site: Path, root: Path = ROOT) -> list[str]:
    """Distinctive lines of a phase's solution code found on that phase's page."""
    leaked = []
    for phase, lines in distinctive_solution_lines(root).items():
        on_page = page_lines(site / "phases" / f"{phase}.html")
        leaked += [f"{phase}: {line}" for line in lines if line in on_page]
    return leaked
