"""Heading anchors as GitHub writes them, so a link like `docs/serving.md#api-keys` works on GitHub, in the
Markdown and on the site alike."""

from __future__ import annotations

import re

_DROP = re.compile(r"[^\w\- ]", re.UNICODE)


def slugify(heading: str) -> str:
    """GitHub's rule: drop Markdown code/emphasis marks and punctuation, lower-case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)        # [text](link) -> text
    text = _DROP.sub("", text.strip().lower())
    return text.replace(" ", "-")


def unique_slugs(headings: list[str]) -> list[str]:
    """Slugs for headings in order; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    slugs = []
    for heading in headings:
        slug = slugify(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.append(slug if count == 0 else f"{slug}-{count}")
    return slugs


_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_headings(text: str) -> list[str]:
    """The ATX headings of a Markdown text, fenced code skipped."""
    headings, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else _HEADING.match(line)
        if match:
            headings.append(match.group(2))
    return headings


def anchors(text: str) -> set[str]:
    return set(unique_slugs(markdown_headings(text)))
