"""Reading a learner's answers without running the notebook: each answer cell fails on its own."""

from __future__ import annotations

import nbformat
import pytest

from labs.course import authoring as A
from labs.course.answers import AnswerCellError, NotImplementedYet, defined_names, load_answers
from labs.course.notebook_format import normalize_notebook, notebook_text


def _write(tmp_path, cells):
    path = tmp_path / "nb.ipynb"
    nbformat.write(A.new_notebook(cells), str(path))
    return path


def _answer(name: str, body: str, grade_id: str):
    return A.answer(f"def {name}(x):\n    ### BEGIN SOLUTION\n{body}\n    ### END SOLUTION", grade_id)


def test_each_answer_cell_fails_only_its_own_exercises(tmp_path):
    path = _write(
        tmp_path,
        [
            A.setup("OFFSET = 10\n%matplotlib inline", "setup"),
            A.code("raise RuntimeError('demo cells are never run by the grader')", "demo"),
            _answer("good", "    return x + OFFSET", "a-good"),
            _answer("stub", "    raise NotImplementedError()", "a-stub"),
            A.answer("def broken(x)\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION", "a-syntax"),
            A.answer("def raises(x):\n    return x\n### BEGIN SOLUTION\n1 / 0\n### END SOLUTION", "a-raises"),
            _answer("after", "    return good(x) * 2", "a-after"),
        ],
    )
    answers = load_answers(path)
    assert answers.get("good")(1) == 11
    assert answers.get("after")(1) == 22  # cells after a broken one still load
    with pytest.raises(NotImplementedError):
        answers.get("stub")(1)  # the stub cell defines a function that raises when called
    with pytest.raises(AnswerCellError, match="SyntaxError"):
        answers.get("broken")
    with pytest.raises(AnswerCellError, match="ZeroDivisionError"):
        answers.get("raises")
    with pytest.raises(AnswerCellError, match="no answer cell"):
        answers.get("missing")


def test_a_cell_that_raises_not_implemented_reports_not_implemented(tmp_path):
    path = _write(
        tmp_path,
        [
            A.answer(
                "### BEGIN SOLUTION\nraise NotImplementedError()\n### END SOLUTION\nclass Thing:\n    pass",
                "a-thing",
            )
        ],
    )
    with pytest.raises(NotImplementedYet, match="not implemented yet"):
        load_answers(path).get("Thing")


def test_a_failing_setup_cell_is_reported(tmp_path):
    path = _write(
        tmp_path, [A.setup("import no_such_module_anywhere", "setup"), _answer("f", "    return x", "a")]
    )
    with pytest.raises(AnswerCellError, match="setup cells"):
        load_answers(path).get("f")


def test_defined_names_with_and_without_valid_syntax():
    assert defined_names("import os\ndef f():\n    pass\nclass K:\n    def m(self): ...\n") == ["f", "K"]
    assert defined_names("def g(:\n    pass\nclass H\n") == ["g", "H"]


def test_authoring_rejects_duplicate_ids_and_bad_cells():
    with pytest.raises(ValueError, match="duplicated"):
        A.new_notebook([_answer("f", "    return x", "same"), A.tests("f(1)", "same", 1)])
    with pytest.raises(ValueError, match="BEGIN SOLUTION"):
        A.answer("def f(): pass", "a")
    with pytest.raises(ValueError, match="points"):
        A.tests("f()", "t", 0)


def test_normalize_strips_outputs_and_pins_the_format():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    notebook.cells[0].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"})]
    notebook.cells[0].execution_count = 3
    notebook.cells[0].metadata["scrolled"] = True
    notebook.metadata["widgets"] = {"state": {}}
    text = notebook_text(notebook)
    normalized = nbformat.reads(text, as_version=4)
    cell = normalized.cells[0]
    assert cell.outputs == [] and cell.execution_count is None and dict(cell.metadata) == {}
    assert normalized.metadata.kernelspec.name == "python3" and "widgets" not in normalized.metadata
    assert (normalized.nbformat, normalized.nbformat_minor) == (4, 5) and cell.id
    assert notebook_text(normalize_notebook(normalized)) == text  # idempotent
