"""The README fits on a screen and tells the truth: the two commands, one phase-map row per phase, links
that resolve. The guides in docs/ are written in the third person."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from book.slugs import anchors

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKDOWN = [README, ROOT / "mini" / "README.md", ROOT / "labs" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_FIRST_PERSON = re.compile(r"\b(I(?!/O)|I'd|I've|I'm|my|we|We|our|Our)\b")


def _prose(text: str) -> str:
    return _INLINE_CODE.sub("", _FENCED.sub("", text))


def test_the_readme_fits_on_a_screen():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_gives_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/course.sh" in text
    assert "bash scripts/test.sh" in text     # the command CI runs (.ci/run)


def test_the_phase_map_has_one_row_per_phase():
    rows = re.findall(r"^\| (\d\d) \| ", README.read_text(encoding="utf-8"), re.MULTILINE)
    phases = sorted(p.name[:2] for p in (ROOT / "phases").iterdir() if p.is_dir() and p.name[:2].isdigit())
    assert rows == phases


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(_FENCED.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_first_person_narrative(path):
    found = [(n, line) for n, line in enumerate(_prose(path.read_text(encoding="utf-8")).splitlines(), 1)
             if _FIRST_PERSON.search(line)]
    assert not found, found


def test_a_broken_link_and_a_first_person_line_are_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [there](missing.md) and [here](#nowhere). I had set it.\n")
    assert _LINK.findall(page.read_text()) == ["missing.md", "#nowhere"]
    assert "nowhere" not in anchors(page.read_text())
    assert _FIRST_PERSON.search(_prose(page.read_text()))
