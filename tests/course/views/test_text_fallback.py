"""Every course widget has a plain-text twin (labs/views/text_view.py): its `text()` and its `text/plain`,
and, where ipywidgets is missing, a `TextView` that prints the same text instead of a widget."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views import batch_rows_widget, recording_from_updates
from labs.views.serving_dashboard import ServingDashboard
from labs.views.text_view import TEXT_VIEW_PREFIX, TextView, html_to_text, stack_views
from mini.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from mini.sampling_params import SamplingParams


def _rows_recording():
    update = BatchUpdate(batch_size=3, removed=[2], added=[(1, SamplingParams(), [7], [])],
                         moved=[(3, 2, MoveDirectionality.UNIDIRECTIONAL)])
    return recording_from_updates(["A", "B", "C", "D"], [(update, ["E"])])


def _dashboard() -> ServingDashboard:
    dashboard = ServingDashboard()
    for running, waiting, usage, tokens in ((1, 2, 0.25, 1), (3, 0, 0.5, 3), (0, 0, 0.0, 0)):
        dashboard(SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage),
                  SimpleNamespace(num_generation_tokens=tokens))
    return dashboard


def test_widgets_carry_their_text():
    widget = batch_rows_widget(_rows_recording())
    assert widget.text().startswith(TEXT_VIEW_PREFIX + "the batch-rows widget")
    assert widget._repr_mimebundle_()["text/plain"] == widget.text()
    dashboard = _dashboard()
    box = dashboard.widget()
    assert box.text() == dashboard.text()
    assert "3 engine steps" in box.text() and "peaks: 3 running, 2 waiting, KV cache 50%" in box.text()
    assert "4 tokens in all" in box.text()
    both = stack_views(batch_rows_widget(_rows_recording()), dashboard.widget())
    assert both.text().startswith(TEXT_VIEW_PREFIX + "the batch-rows widget") and "3 engine steps" in both.text()
    assert both._repr_mimebundle_()["text/plain"] == both.text() and len(both.children) == 2


def test_without_ipywidgets_the_widgets_are_text_views(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # `import ipywidgets` raises ImportError
    with pytest.raises(ImportError):
        import ipywidgets  # noqa: F401
    for view in (batch_rows_widget(_rows_recording()), _dashboard().widget()):
        assert isinstance(view, TextView) and repr(view).startswith(TEXT_VIEW_PREFIX)
    rows = batch_rows_widget(_rows_recording())
    assert "(step 0 of 0..0)" in rows.text()
    with pytest.raises(ValueError, match="not in this recording"):
        rows.text(5)


def test_html_to_text_keeps_rows_cells_and_list_items():
    page = "<div><b>step 1</b><table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>" \
           "<ul><li>x &amp; y</li></ul></div>"
    assert html_to_text(page) == "step 1\na | b\n1 | 2\n - x & y"
