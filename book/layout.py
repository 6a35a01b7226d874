"""The page template: the top bar with the search box, the navigation (every page), the "run it yourself"
box, the content, and links to the previous and next page. Every URL is relative to the page, so the site
works from any folder or from file://."""

from __future__ import annotations

import html
import re

from book.pages import Page

CLONE = "git clone <this repository's URL> mini-course && cd mini-course"


def run_it_yourself(page: Page) -> str:
    if page.kind == "phase":
        folder = page.source.parent.name
        where = (f"then open <code>phases/{folder}/{folder}.ipynb</code> and grade it with "
                 f"<code>pytest labs/ -k {folder}</code>. This phase {html.escape(page.needs)}.")
    else:
        where = "then every phase is in <code>phases/</code>; only <code>python -m mini bench gpu</code> needs a GPU."
    return f"""<aside class="run-it" aria-label="Run it yourself">
<h2>Run it yourself</h2>
<pre><code>{html.escape(CLONE)}
bash scripts/course.sh    # set up, then JupyterLab on the learner notebooks
bash scripts/test.sh      # set up, then the whole test suite</code></pre>
<p>Python 3.10+, a CPU, offline after set-up; {where}</p>
</aside>"""


def title_html(title: str) -> str:
    """A page title for the navigation: `code` spans as code, the rest escaped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(title))


def navigation(pages: list[Page], current: Page) -> str:
    groups = [("Start", [p for p in pages if p.kind == "home"]), ("Phases", [p for p in pages if p.kind == "phase"]),
              ("Guides", [p for p in pages if p.kind == "guide"])]
    marked = ' class="current" aria-current="page"'
    parts = []
    for name, members in groups:
        items = "".join(f'<li><a href="{current.root}{p.url}"{marked if p is current else ""}>'
                        f"{title_html(p.title)}</a></li>" for p in members)
        parts.append(f"<h2>{name}</h2><ul>{items}</ul>")
    return '<nav class="side" aria-label="Pages">' + "".join(parts) + "</nav>"


def pager(pages: list[Page], current: Page) -> str:
    index = pages.index(current)
    before = pages[index - 1] if index > 0 else None
    after = pages[index + 1] if index + 1 < len(pages) else None
    left = (f'<a rel="prev" href="{current.root}{before.url}">← {title_html(before.title)}</a>'
            if before else "<span></span>")
    right = (f'<a rel="next" href="{current.root}{after.url}">{title_html(after.title)} →</a>'
             if after else "<span></span>")
    return f'<nav class="pager" aria-label="Previous and next">{left}{right}</nav>'


def page_html(pages: list[Page], page: Page, content: str) -> str:
    root = page.root
    return f"""<!DOCTYPE html>
<html lang="en" data-root="{root}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(page.title.replace("`", ""))} — mini</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}_static/book.css">
</head>
<body>
<header class="top">
<a class="brand" href="{root}index.html">mini</a>
<div id="search-box" role="search">
<input id="search-input" type="search" placeholder="Search the book" aria-label="Search the book" autocomplete="off">
<ul id="search-results"></ul>
</div>
</header>
<div class="layout">
{navigation(pages, page)}
<main>
{run_it_yourself(page)}
{content}
{pager(pages, page)}
</main>
</div>
<script src="{root}_static/search.js"></script>
</body>
</html>
"""
