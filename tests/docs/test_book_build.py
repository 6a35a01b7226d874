"""`python -m book build` makes the site: a page per phase (from the learner notebook, the Mini build
executed) and per guide, a search index, internal links and anchors that resolve, and no solution code.

CI's budget: the Mini build runs here for one phase (01: a widget with its static picture); the others are
rendered unexecuted. `bash scripts/book.sh` executes all of them (docs/book.md gives the time)."""

from __future__ import annotations

import json
import re

import pytest

from book import check
from book.build import build
from book.pages import all_pages

EXECUTED = "01"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("book") / "site"
    # Built with MPLBACKEND=Agg in the environment, as a test process may have it: the kernel still draws inline.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPLBACKEND", "Agg")
        build(out, execute=EXECUTED, cache_dir=out.parent / "cache", log=lambda line: None)
    return out


def test_every_phase_and_guide_has_a_page(site):
    pages = all_pages()
    assert sum(p.kind == "phase" for p in pages) >= 16 and sum(p.kind == "guide" for p in pages) >= 10
    missing = [p.url for p in pages if not (site / p.url).exists()]
    assert not missing


def test_the_executed_phase_shows_its_outputs_and_picture(site):
    page = (site / "phases" / "01_paged_kv.html").read_text(encoding="utf-8")
    assert 'class="output widget-text"' in page and "Text view of " in page      # the widget's text twin
    pictures = re.findall(r'<img class="output" src="(img/[^"]+)"', page)
    assert pictures and all((site / "phases" / src).stat().st_size > 1000 for src in pictures)
    assert "YOUR CODE HERE" in page                                               # the learner's lab cells


def test_every_page_has_search_and_run_it_yourself(site):
    for page in all_pages():
        text = (site / page.url).read_text(encoding="utf-8")
        assert 'id="search-input"' in text and "Run it yourself" in text and "bash scripts/test.sh" in text
    index = (site / "search-index.js").read_text(encoding="utf-8")
    entries = json.loads(index.removeprefix("window.BOOK_SEARCH_INDEX = ").rstrip().rstrip(";"))
    assert {e["url"].split("#")[0] for e in entries} >= {p.url for p in all_pages()}


def test_the_phase_page_says_what_it_needs(site):
    assert "needs Linux x86_64" in (site / "phases" / "07_attention_kernel.html").read_text(encoding="utf-8")
    assert "no GPU is needed" in (site / "phases" / "05_scheduler.html").read_text(encoding="utf-8")


def test_every_internal_link_and_anchor_resolves(site):
    assert check.broken_links(site) == []


def test_no_solution_code_reaches_the_site(site):
    assert sum(len(b) for b in check.solution_blocks().values()) >= 50
    assert sum(len(lines) for lines in check.distinctive_solution_lines().values()) >= 200
    assert check.leaked_solution_lines(site) == []


def test_a_leaked_solution_and_a_broken_link_are_caught(site, tmp_path):
    import shutil

    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    phase, lines = next((phase, lines) for phase, lines in check.distinctive_solution_lines().items() if lines)
    line = lines[0]
    page = copy / "phases" / f"{phase}.html"
    page.write_text(page.read_text(encoding="utf-8").replace("</main>",
                                                             f"<pre>\n{line}\n</pre>\n"
                                                             "<a href=\"#nowhere\">x</a></main>"),
                    encoding="utf-8")
    assert check.leaked_solution_lines(copy) == [f"{phase}: {line}"]
    assert any("#nowhere" in b for b in check.broken_links(copy))
