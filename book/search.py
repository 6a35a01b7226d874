"""The search index: one entry per section (a heading and the text up to the next heading) of every page,
written as search-index.js (`window.BOOK_SEARCH_INDEX = [...]`), a script rather than JSON so that the
search box also works on a site opened from file://, where a page cannot fetch JSON."""

from __future__ import annotations

import json
import re

from book.markdown import plain_text

TEXT_LIMIT = 1500
_HEADING = re.compile(r'<h([1-6]) id="([^"]+)">(.*?)(?:<a class="anchor"[^>]*>#</a>)?</h\1>', re.DOTALL)


def sections(url: str, page_title: str, content: str) -> list[dict]:
    entries = []
    matches = list(_HEADING.finditer(content))
    starts = [(0, "", page_title)] + [(m.start(), m.group(2), plain_text(m.group(3))) for m in matches]
    for number, (start, anchor, title) in enumerate(starts):
        end = starts[number + 1][0] if number + 1 < len(starts) else len(content)
        text = plain_text(_HEADING.sub(" ", content[start:end]))
        if not text and number == 0:
            continue
        entries.append({"url": url + (f"#{anchor}" if anchor else ""), "title": title or page_title,
                        "page": page_title, "text": text[:TEXT_LIMIT]})
    return entries


def index_script(entries: list[dict]) -> str:
    return "window.BOOK_SEARCH_INDEX = " + json.dumps(entries, ensure_ascii=False, separators=(",", ":")) + ";\n"
