"""Markdown -> HTML for the site: GitHub's heading anchors (book/slugs.py), highlighted code, and links
rewritten so that what works on GitHub works on the site. A link to a page the site has (README.md, a guide,
a phase) goes to that page; a link to any other repository file becomes its name in code, unlinked (the
site holds pages, not the repository); links out (https:) stay as they are."""

from __future__ import annotations

import html
import re
from pathlib import Path

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from book.pages import ROOT, site_url_of
from book.slugs import unique_slugs

_FORMATTER = HtmlFormatter(nowrap=True)


def highlight_code(code: str, language: str) -> str:
    try:
        lexer = get_lexer_by_name(language or "text")
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(code, lexer, _FORMATTER)


def _fence(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    language = token.info.strip().split()[0] if token.info.strip() else "text"
    return f'<pre class="code"><code>{highlight_code(token.content, language)}</code></pre>\n'


def _heading_close(self, tokens, idx, options, env) -> str:
    """A heading ends with a link to itself, for pointing someone at a section."""
    slug = tokens[idx - 2].attrGet("id")
    link = f'<a class="anchor" href="#{slug}" aria-label="Link to this section">#</a>' if slug else ""
    return f"{link}</{tokens[idx].tag}>\n"


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _fence)
    md.add_render_rule("heading_close", _heading_close)
    return md


def rewrite_href(href: str, source: Path, page_root: str) -> str | None:
    """The site URL for a link found in `source` (a file of the repository), relative to the linking page;
    None when the target has no page on the site."""
    if re.match(r"[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
        return href
    target, _, anchor = href.partition("#")
    url = site_url_of((source.parent / target), ROOT)
    if url is None:
        return None
    return page_root + url + (f"#{anchor}" if anchor else "")


def render(text: str, source: Path, page_root: str, slug_prefix: str = "") -> tuple[str, list[tuple[int, str, str]]]:
    """(HTML, [(level, slug, heading text)]) for one Markdown text of `source`."""
    md = _parser()
    tokens = md.parse(text)
    heading_tokens = [(i, t) for i, t in enumerate(tokens) if t.type == "heading_open"]
    slugs = unique_slugs([tokens[i + 1].content for i, _ in heading_tokens])
    headings = []
    for (i, token), slug in zip(heading_tokens, slugs, strict=False):
        token.attrSet("id", slug_prefix + slug)
        headings.append((int(token.tag[1]), slug_prefix + slug, tokens[i + 1].content))
    for token in tokens:
        for child in token.children or []:
            if child.type == "link_open":
                url = rewrite_href(child.attrGet("href") or "", source, page_root)
                if url is None:
                    child.attrs.pop("href", None)
                    child.attrSet("class", "repo-path")
                else:
                    child.attrSet("href", url)
    return md.renderer.render(tokens, md.options, {}), headings


def plain_text(markup: str) -> str:
    """Text of an HTML fragment, for the search index."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", markup))).strip()
