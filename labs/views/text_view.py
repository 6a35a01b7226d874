"""Mirrors no vllm/v1 file: the plain-text twin every course widget carries.

A widget needs a live kernel and a front end with the widget manager; a notebook opened on GitHub, converted
by nbconvert, or run where ipywidgets is missing shows an output's `text/plain` instead (ipywidgets' own is
`VBox(children=(...))`, which teaches nothing). So every widget of `labs.views`:

- is a `ViewBox` (an `ipywidgets.VBox`) whose `text/plain` is what the board shows, as text, and which has a
  `text(step=None)` method a notebook can `print` (a step-replay widget: the step its slider shows, or any
  other step);
- falls back to a `TextView` (the same text, no widgets) where `import ipywidgets` fails.

Every fallback text starts with `TEXT_VIEW_PREFIX` (the browser suite treats it as a widget that did not
render, tests/browser/lab_page.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TEXT_VIEW_PREFIX = "Text view of "

_BOX_CLASS: Any = None


def header(title: str, note: str = "") -> str:
    """The first line of every fallback text."""
    return f"{TEXT_VIEW_PREFIX}{title}" + (f" ({note})" if note else "")


class TextView:
    """What a widget shows, as plain text, for places with no ipywidgets: printing it prints the text."""

    def __init__(self, render: Callable[[Any], str]) -> None:
        self._render = render

    def text(self, step: Any = None) -> str:
        return self._render(step)

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())


def have_widgets() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def view_box(children: list[Any], render: Callable[[Any], str]) -> Any:
    """A `ViewBox` of `children` whose `text(step)` (and `text/plain`) is `render(step)`."""
    global _BOX_CLASS
    if _BOX_CLASS is None:
        import ipywidgets as widgets

        class ViewBox(widgets.VBox):
            """An ipywidgets VBox with a plain-text twin: `text(step=None)`; also its `text/plain`."""

            def text(self, step: Any = None) -> str:
                return self._render_text(step)

            def _repr_mimebundle_(self, **kwargs: Any) -> Any:
                data = super()._repr_mimebundle_(**kwargs)
                if isinstance(data, dict):
                    data["text/plain"] = self.text()
                return data

        _BOX_CLASS = ViewBox
    box = _BOX_CLASS(children)
    box._render_text = render
    return box


def replay_text(title: str, first: int, last: int, page: Callable[[int], str],
                current: Callable[[], int] | None = None) -> Callable[[Any], str]:
    """The text of a step-replay widget: `page(step)` for the step asked (default: the one shown now),
    under a header naming it, with a line telling how to print the others."""

    def render(step: Any = None) -> str:
        chosen = (current() if current is not None else first) if step is None else int(step)
        if not first <= chosen <= last:
            raise ValueError(f"step {chosen} is not in this recording (steps {first}..{last})")
        return (f"{header(title, f'step {chosen} of {first}..{last}')}\n{page(chosen).rstrip()}\n"
                f"(print(widget.text(k)) shows step k)")

    return render


def html_to_text(markup: str) -> str:
    """A board's HTML as readable plain text: rows on lines, cells split by ' | ', list items bulleted."""
    import html as html_module
    import re

    text = re.sub(r"(?is)<(script|style)\b.*?</\1>", "", markup)
    text = re.sub(r"(?i)<br\s*/?>|</tr>|</div>|</p>|</h\d>|</table>|<table[^>]*>|</ul>", "\n", text)
    text = re.sub(r"(?i)<li[^>]*>", "\n  - ", text)
    text = re.sub(r"(?i)</t[dh]>\s*<t[dh][^>]*>", " | ", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = html_module.unescape(text)
    lines = [re.sub(r"[ \t]+", " ", line).rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip())


def stack_views(*views: Any) -> Any:
    """Several course widgets one under the other (a `ViewBox`): its text is theirs, one after the other."""

    def render(step: Any = None) -> str:
        return "\n\n".join(view.text(step) for view in views)

    if not have_widgets() or any(isinstance(view, TextView) for view in views):
        return TextView(render)
    return view_box(list(views), render)
