"""The labs ask for thought, not transcription (issue 38): what the notebook text of every exercise must hold.

For every exercise of every phase (solutions/NN_topic/NN_topic.ipynb, the text the release copies to phases/):

* its heading cell names its `-k` handle (`*Grade it alone:* `pytest labs/ -k pNN_name``), which selects that
  exercise and no other (checked against pytest's own `-k` matching in tests/course/test_labs.py);
* its hints come in three tiers, each in its own fold, in order: `Hint 1` (the question to ask), `Hint 2` (the
  invariant or a worked trace), `Hint 3` (near-code). Only the third may come close to the answer;
* no code of the solution shows outside a Hint 3 fold: no inline code span or fenced line of any markdown cell
  of the notebook is a piece of a solution line, where a piece is a fragment of at least 16 characters
  (whitespace ignored) that carries an operator, an index or a call with several arguments (names alone, such as
  an API the exercise calls, do not count).

And every phase has at least one exercise whose table row says what the learner designs (`Exercise.design`):
the notebook states the contract and why it matters, and leaves the how open.
"""

from __future__ import annotations

import re

import pytest

from labs.course.answers import defined_names
from labs.course.notebook_format import read_notebook
from labs.course.release import REPO_ROOT
from labs.manifest import Phase, all_phases

FOLD = re.compile(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", re.DOTALL)
HINT_SUMMARY = re.compile(r"<summary>\s*(?:\*\*)?Hint (\d)\b")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"```[A-Za-z]*\n(.*?)```", re.DOTALL)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.DOTALL)
OPERATOR = re.compile(r"[=+\-*/<>%&|\[]")
MIN_PIECE = 16

PHASES = all_phases()


def _notebook(phase: Phase):
    return read_notebook(REPO_ROOT / "solutions" / phase.assignment_id / f"{phase.assignment_id}.ipynb")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _answer_index(cells, name: str) -> int:
    return next(i for i, c in enumerate(cells) if c.cell_type == "code"
                and c.metadata.get("nbgrader", {}).get("solution") and name in defined_names(c.source))


def _exercise_text(cells, answer_index: int) -> tuple[int, str]:
    """(index of the heading cell, the markdown from the exercise's heading down to its answer cell)."""
    start = answer_index - 1
    while start >= 0 and not (cells[start].cell_type == "markdown" and "### Exercise" in cells[start].source):
        start -= 1
    text = "\n".join(c.source for c in cells[max(start, 0):answer_index] if c.cell_type == "markdown")
    return start, text[text.index("### Exercise"):] if "### Exercise" in text else text


def _is_piece(fragment: str) -> bool:
    """A fragment of code that says how, not just what is called: long enough, with an operator, an index
    or a call of several arguments."""
    return len(fragment) >= MIN_PIECE and bool(OPERATOR.search(fragment) or ("(" in fragment and "," in fragment))


def _solution_lines(cells) -> list[str]:
    lines = []
    for cell in cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            for block in SOLUTION.findall(cell.source):
                lines += [_squash(line.split("#")[0]) for line in block.splitlines()]
    return [line for line in lines if line]


def _outside_hint_3(markdown: str) -> str:
    return FOLD.sub(lambda m: "" if HINT_SUMMARY.search(f"<summary>{m.group(1)}") and
                    HINT_SUMMARY.search(f"<summary>{m.group(1)}").group(1) == "3" else m.group(0), markdown)


@pytest.mark.parametrize("phase", PHASES, ids=[p.assignment_id for p in PHASES])
def test_every_exercise_names_its_handle(phase):
    cells = _notebook(phase).cells
    missing = []
    for exercise in phase.exercises:
        _, text = _exercise_text(cells, _answer_index(cells, exercise.name))
        if f"pytest labs/ -k {exercise.handle(phase.assignment_id)}`" not in text:
            missing.append(f"{exercise.name} (`pytest labs/ -k {exercise.handle(phase.assignment_id)}`)")
    assert not missing, f"exercise headings without their -k handle: {missing}"


@pytest.mark.parametrize("phase", PHASES, ids=[p.assignment_id for p in PHASES])
def test_every_exercise_has_three_tiers_of_hints(phase):
    cells = _notebook(phase).cells
    wrong = []
    for exercise in phase.exercises:
        _, text = _exercise_text(cells, _answer_index(cells, exercise.name))
        tiers = [int(m.group(1)) for m in HINT_SUMMARY.finditer(text)]
        opened, closed = text.count("<details>"), text.count("</details>")
        nested = any("<details>" in body for _, body in FOLD.findall(text))
        if tiers != [1, 2, 3] or opened != closed or nested:
            wrong.append(f"{exercise.name}: hint tiers {tiers}, {opened} folds opened, {closed} closed"
                         f"{', nested' if nested else ''}")
    assert not wrong, ("each exercise needs three folds `<details><summary>Hint 1 ...`, `Hint 2 ...`, `Hint 3 ...`,"
                       " in that order, none inside another:\n" + "\n".join(wrong))


@pytest.mark.parametrize("phase", PHASES, ids=[p.assignment_id for p in PHASES])
def test_no_solution_code_outside_the_last_hint(phase):
    cells = _notebook(phase).cells
    solution = _solution_lines(cells)
    shown = []
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        visible = _outside_hint_3(cell.source)
        fenced = [line for block in FENCE.findall(visible) for line in block.splitlines()]
        fragments = CODE_SPAN.findall(visible) + fenced
        for fragment in fragments:
            piece = _squash(fragment)
            if _is_piece(piece) and any(piece in line for line in solution):
                shown.append(f"markdown cell {index} ({cell.id}): `{fragment.strip()}`")
    assert not shown, "solution code shown outside a Hint 3 fold:\n" + "\n".join(shown)


@pytest.mark.parametrize("phase", PHASES, ids=[p.assignment_id for p in PHASES])
def test_every_phase_has_a_design_exercise(phase):
    designed = [e.name for e in phase.exercises if e.design.strip()]
    assert designed, (f"{phase.assignment_id}: no exercise asks the learner to design something the notebook "
                      "leaves open (set `design=` on its Exercise row)")


def test_the_transcription_rule_catches_formulas_and_spares_names():
    solution = [_squash("return max(0, min(num_new_tokens, max_model_len - num_computed_tokens - 1))")]
    assert _is_piece(_squash("max_model_len - num_computed_tokens - 1"))
    assert any(_squash("max_model_len - num_computed_tokens - 1") in line for line in solution)
    assert not _is_piece(_squash("num_computed_tokens"))            # a name
    assert not _is_piece(_squash("get_computed_blocks(request)"))   # a call of the API with one argument
    text = "<details><summary>Hint 3 — near-code</summary>\n`a - b - 1`\n</details>\nsee `x[i] + y`"
    assert "a - b - 1" not in _outside_hint_3(text) and "x[i] + y" in _outside_hint_3(text)
