"""Build the site: `python -m book build [--out DIR] [--execute all|none|NN,NN]`.

Pages (book/pages.py): the README as the home page, every phase from its learner notebook (phases/), every
guide (docs/). Writes DIR/index.html, DIR/phases/*.html (and their figures in DIR/phases/img/),
DIR/docs/*.html, DIR/_static/, DIR/search-index.js. Fetches nothing: the notebooks run on the shipped model
and the installed packages, offline (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat

from book import search
from book.layout import page_html
from book.markdown import render
from book.notebook import execute_mini_build, render_notebook
from book.pages import ROOT, Page, all_pages

STATIC = Path(__file__).resolve().parent / "static"
DEFAULT_OUT = ROOT / "_build" / "book"


def wants_execution(page: Page, execute: str) -> bool:
    if execute == "all":
        return True
    if execute == "none":
        return False
    return page.source.parent.name[:2] in {number.strip() for number in execute.split(",")}


def build(out: Path = DEFAULT_OUT, execute: str = "all", cache_dir: Path | None = None, log=print) -> list[Page]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    cache_dir = cache_dir or out.parent / "book-cache"
    pages = all_pages()
    if out.exists():
        shutil.rmtree(out)
    (out / "phases" / "img").mkdir(parents=True)
    (out / "docs").mkdir()
    shutil.copytree(STATIC, out / "_static")
    entries = []
    for page in pages:
        started = time.monotonic()
        if page.kind == "phase":
            executed = wants_execution(page, execute)
            notebook = (execute_mini_build(page.source, cache_dir) if executed
                        else nbformat.read(page.source, as_version=4))
            content, _, images = render_notebook(notebook, page.source, page.root)
            for name, data in images:
                (out / "phases" / "img" / name).write_bytes(data)
            note = "Mini build executed" if executed else "not executed"
        else:
            content, _ = render(page.source.read_text(encoding="utf-8"), page.source, page.root)
            note = "page"
        (out / page.url).write_text(page_html(pages, page, content), encoding="utf-8")
        entries += search.sections(page.url, page.title, content)
        log(f"{page.url}: {note} ({time.monotonic() - started:.1f} s)")
    (out / "search-index.js").write_text(search.index_script(entries), encoding="utf-8")
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m book build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--execute", default="all",
                        help="which phases' Mini build to execute: all (default), none, or numbers: 01,05")
    parser.add_argument("--cache", type=Path, default=None,
                        help="executed notebooks kept between builds (default: book-cache beside --out)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    pages = build(args.out.resolve(), args.execute, args.cache)
    print(f"built {len(pages)} pages into {args.out} in {time.monotonic() - started:.0f} s; "
          f"open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
