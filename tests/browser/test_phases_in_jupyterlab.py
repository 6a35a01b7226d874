"""Every phase notebook, run in JupyterLab in a real browser: it runs without a cell error, every widget
renders as a widget, the console stays clean, and the step-replay widgets answer their slider.

The kernel-side tests (tests/course/test_notebooks.py) execute the same notebooks without a front end; what
only this suite catches is the browser half: a missing labextension, a widget-manager or JupyterLab upgrade
that breaks rendering, a front-end error. A screenshot and the executed notebook of each phase are saved
under test-artifacts/browser/ for a reviewer.
"""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest
from patience import HANG_GUARD_S, RUN_GUARD_S

from labs.course.release import list_assignments
from tests.browser.lab_page import (
    WIDGET_FAILURE_TEXTS,
    WIDGET_FALLBACK_PREFIXES,
    WIDGET_OUTPUT_MIME,
    NotebookPage,
    wait_for,
)

RUN_ALL_TIMEOUT_S = RUN_GUARD_S

# The step-replay widgets and how each board names the step it shows: moving the slider must redraw the
# board for exactly that step. (phase: regex over the board's text giving the step it draws)
STEP_LABELS = {
    "01_paged_kv": r"\bstep (\d+)\b",
    "05_scheduler": r"\bstep (\d+)\s*:",
    "09_logits_processors": r"^\s*step (\d+)\b",
    "10_prefix_caching": r"\bstep (\d+)\b",
    "12_spec_decode": r"\bstep (\d+)\b",
}


def _widget_outputs(notebook: nbformat.NotebookNode) -> int:
    return sum(WIDGET_OUTPUT_MIME in output.get("data", {})
               for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs)


def _errors(notebook: nbformat.NotebookNode) -> list[str]:
    return [f"{output.ename}: {output.evalue}"
            for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if output.output_type == "error"]


def widget_problems(page: NotebookPage, notebook: nbformat.NotebookNode) -> list[str]:
    """What a learner would see as a broken widget, in words (empty when every widget rendered)."""
    problems = []
    text = page.page_text()
    problems += [f"the page shows {t!r}" for t in WIDGET_FAILURE_TEXTS if t in text]
    if page.error_widgets():
        problems.append(f"{page.error_widgets()} widget(s) replaced by the widget manager's error placeholder")
    problems += [f"a widget shown as plain text (no widget manager?): {t[:80]!r}"
                 for t in page.plain_text_outputs() if t.lstrip().startswith(WIDGET_FALLBACK_PREFIXES)]
    expected, drawn = _widget_outputs(notebook), page.rendered_widget_outputs()
    if drawn != expected:
        problems.append(f"{expected} widget outputs in the notebook, {drawn} drawn as widgets")
    return problems


def check_rendering(page: NotebookPage, notebook: nbformat.NotebookNode) -> None:
    """What a learner would see as broken: cell errors, widgets that did not render, console errors."""
    assert _errors(notebook) == [], f"cells raised in the browser: {_errors(notebook)}"
    assert widget_problems(page, notebook) == []
    assert page.console_errors() == [], f"browser console errors: {page.console_errors()}"


def _step_shown(label: str, board_html: str) -> int:
    text = re.sub(r"<[^>]+>", " ", board_html)
    found = re.search(label, text)
    assert found, f"the board names no step ({label!r}): {text[:200]!r}"
    return int(found.group(1))


def check_slider(page: NotebookPage, label: str) -> None:
    """Move the first step-replay widget's slider one step and back: the board redraws for that step, and
    coming back restores exactly what it showed."""
    from selenium.webdriver.common.keys import Keys

    boxes = page.slider_widgets()
    assert boxes, "no step-replay widget (slider + board) on the page"
    box = boxes[0]
    readout, board = page.slider_state(box)
    step = _step_shown(label, board)
    key, back = (Keys.ARROW_RIGHT, Keys.ARROW_LEFT) if page.js(
        "return arguments[0].querySelector('.noUi-handle').getAttribute('aria-valuenow') !=="
        " arguments[0].querySelector('.noUi-handle').getAttribute('aria-valuemax');", box) else (
        Keys.ARROW_LEFT, Keys.ARROW_RIGHT)
    moved_readout, moved_board = page.press_on_slider(box, key)
    assert int(moved_readout) == int(readout) + (1 if key == Keys.ARROW_RIGHT else -1)
    moved_step = _step_shown(label, moved_board)
    assert moved_step != step, f"the board still shows step {step} after the slider moved"
    assert moved_step - step == int(moved_readout) - int(readout), (
        f"the slider moved from {readout} to {moved_readout} but the board went from step {step} to {moved_step}")
    returned_readout, returned_board = page.press_on_slider(box, back)
    assert (returned_readout, returned_board) == (readout, board), "moving back did not restore the board"


def _fsm_lines(page: NotebookPage, box) -> tuple[str, str]:
    """The widget's printed ("tokens so far: ...", "allowed next (N): ...") lines ("" where missing)."""
    lines = page.js("return arguments[0].querySelector('.widget-output').innerText;", box).splitlines()
    tokens = next((line for line in lines if line.startswith("tokens so far:")), "")
    allowed = next((line for line in lines if line.startswith("allowed next")), "")
    return tokens, allowed


def check_fsm_buttons(page: NotebookPage) -> None:
    """Phase 11's FSM-mask widget: "sample next token" appends one allowed token (the prefix grows and the
    state's allowed set is redrawn); "reset" empties the prefix again."""
    from selenium.webdriver.common.by import By

    boxes = [box for box in page.browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-vbox")
             if any(b.text == "sample next token" for b in box.find_elements(By.CSS_SELECTOR, "button"))]
    assert boxes, "no FSM-mask widget (a 'sample next token' button) on the page"
    box = boxes[0]
    button = {b.text: b for b in box.find_elements(By.CSS_SELECTOR, "button")}
    start = wait_for(lambda: _fsm_lines(page, box)[0], HANG_GUARD_S, "the widget's 'tokens so far' line")
    page.js("arguments[0].scrollIntoView({block: 'center'});", box)
    button["sample next token"].click()
    grown = wait_for(lambda: _fsm_lines(page, box)[0] != start and _fsm_lines(page, box)[0], HANG_GUARD_S,
                     "the prefix to grow after 'sample next token'")
    assert grown.rstrip("]").startswith(start.rstrip("]")) and len(grown) > len(start), (start, grown)
    assert _fsm_lines(page, box)[1], "no 'allowed next' line after sampling"
    wait_for(lambda: "drawn from the model's masked distribution" in page.js(
        "return arguments[0].querySelector('.widget-output').innerText;", box), HANG_GUARD_S,
        "the 'last sample' line: drawn from the model's masked distribution")
    button["reset"].click()
    wait_for(lambda: _fsm_lines(page, box)[0] == "tokens so far: []", HANG_GUARD_S, "reset to empty the prefix")
    wait_for(lambda: page.js("return arguments[0].querySelectorAll('.widget-output img').length;", box), HANG_GUARD_S,
             "the DFA figure to be redrawn after reset")


def check_block_slots(page: NotebookPage) -> None:
    """Phase 01's block-table widget draws each block as its slots (filled ones shaded), names every owner
    with the block's ref count, and carries a legend: one step forward (step 1 allocates blocks), then back."""
    from selenium.webdriver.common.keys import Keys

    boxes = [box for box in page.slider_widgets()
             if page.js("return !!arguments[0].querySelector('.bt-legend');", box)]
    assert boxes, "no block-table board with a legend on the page"
    box = boxes[0]
    _, board = page.press_on_slider(box, Keys.ARROW_RIGHT)
    counts = page.js(
        "const b = arguments[0].querySelector('.widget-html-content');"
        "return [b.querySelectorAll('.bt-slot').length, b.querySelectorAll('.bt-filled').length,"
        " b.querySelectorAll('.bt-ref').length, b.querySelectorAll('.bt-owners').length];", box)
    page.press_on_slider(box, Keys.ARROW_LEFT)
    slots, filled, refs, owners = counts
    assert refs == owners >= 1 and slots % refs == 0 and 0 < filled <= slots, (counts, board[:300])
    assert "allocated slots empty" in board, board[:300]


def check_fsm_mask_content(page: NotebookPage) -> None:
    """Phase 11's FSM-mask widget shows the state table, the allowed tokens grouped, one int32 word as 32 bits
    and the model's probabilities before and after the mask; sampling says it drew from the model."""
    found = page.js(
        "const r = document.querySelector('.jp-OutputArea-output .widget-output .fsm-report');"
        "if (!r) return null;"
        "return {bits: r.querySelectorAll('.fsm-word .fsm-bit').length, table: !!r.querySelector('.fsm-table'),"
        " groups: r.querySelectorAll('.fsm-groups li').length, probs: !!r.querySelector('.fsm-probs'),"
        " text: r.innerText};")
    assert found, "no FSM report (state table, groups, mask word) inside the widget"
    assert found["bits"] == 32 and found["table"] and found["groups"] >= 1 and found["probs"], found
    assert "before the mask" in found["text"] and "after the mask" in found["text"], found["text"][:300]
    wait_for(lambda: page.js("const r = document.querySelector('.jp-OutputArea-output .widget-output .fsm-report');"
                             "return r.closest('.widget-output').querySelectorAll('img').length;"), HANG_GUARD_S,
             "the DFA figure inside the FSM-mask widget")


def check_live_dashboard(page: NotebookPage) -> None:
    """Phase 13's dashboard (an Output widget the engine's stat logger redraws during a burst of clients)
    ends showing its chart: an image inside the widget, not an empty box."""
    images = page.js("return [...document.querySelectorAll('.jp-OutputArea-output .widget-output')]"
                     ".map(o => o.querySelectorAll('img').length);")
    assert images and max(images) >= 1, f"the dashboard widget drew no chart (images per Output widget: {images})"


@pytest.mark.parametrize("assignment_id", list_assignments())
def test_phase_runs_and_renders_in_jupyterlab(assignment_id, lab, browser, artifacts):
    path = f"solutions/{assignment_id}/{assignment_id}.ipynb"
    page = NotebookPage(lab, browser, path)
    try:
        page.run_all(RUN_ALL_TIMEOUT_S)
        notebook = page.save_and_read()
        page.screenshot(artifacts / f"{assignment_id}.png")
        shutil.copy(lab.root / path, artifacts / f"{assignment_id}.ipynb")
        check_rendering(page, notebook)
        if assignment_id in STEP_LABELS:
            check_slider(page, STEP_LABELS[assignment_id])
            page.screenshot(artifacts / f"{assignment_id}-slider.png")
        if assignment_id == "01_paged_kv":
            check_block_slots(page)
        if assignment_id == "11_structured_output":
            check_fsm_mask_content(page)
            check_fsm_buttons(page)
            page.screenshot(artifacts / f"{assignment_id}-fsm.png")
        if assignment_id == "13_serving":
            check_live_dashboard(page)
    finally:
        lab.shutdown_kernels()


BROKEN_WIDGET = """\
import ipywidgets
import traitlets

class Broken(ipywidgets.DOMWidget):
    _view_name = traitlets.Unicode("NoSuchView").tag(sync=True)
    _view_module = traitlets.Unicode("no-such-widget-module").tag(sync=True)
    _view_module_version = traitlets.Unicode("1.0.0").tag(sync=True)

ipywidgets.VBox([ipywidgets.IntSlider(), Broken()])
"""


def test_a_broken_widget_fails_the_rendering_check(lab, browser):
    """The check above can fail: a widget whose front-end module does not exist is caught."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(BROKEN_WIDGET)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = lab.root / "broken_widget.ipynb"
    nbformat.write(notebook, str(path))
    page = NotebookPage(lab, browser, path.name)
    try:
        page.run_all(RUN_ALL_TIMEOUT_S)
        saved = page.save_and_read()
        assert _widget_outputs(saved) == 1
        problems = widget_problems(page, saved)
        assert any("error placeholder" in p for p in problems), problems
        assert any("javascript error" in p for p in problems), problems
        assert any("no-such-widget-module" in message for message in page.console_errors())
        with pytest.raises(AssertionError):
            check_rendering(page, saved)
    finally:
        lab.shutdown_kernels()


def test_formgrader_lists_every_assignment(lab, browser):
    """nbgrader in the browser: the formgrader opens under the course root and lists the phases."""
    browser.get(f"{lab.url}/formgrader?token={lab.token}")
    names = wait_for(lambda: browser.execute_script(
        "return [...document.querySelectorAll('#main_table td, .assignment-name, a')].map(e => e.textContent.trim())"
        ".filter(t => /^\\d\\d_/.test(t));"), HANG_GUARD_S, "the formgrader's assignment list")
    assert set(list_assignments()) <= set(names), f"formgrader lists {sorted(set(names))}"
