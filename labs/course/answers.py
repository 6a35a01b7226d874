"""Mirrors no vllm/v1 file: read a learner's answers out of a notebook without running the notebook.

The labs grader (labs/conftest.py) needs the functions and classes a learner wrote, and nothing
else: no widgets, no engine runs. So it

1. runs the notebook's setup cells (code cells tagged "setup": imports, constants) in one namespace;
2. runs each nbgrader answer cell (metadata nbgrader.solution = true, code) in its OWN try block in
   that namespace, recording the error of a cell that raises or does not parse;
3. maps every top-level `def`/`class` name to the answer cell that defines it.

An answer cell that fails therefore fails only the exercises whose names it defines.
"""

from __future__ import annotations

import ast
import linecache
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", re.MULTILINE)


class NotImplementedYet(AssertionError):
    """An exercise whose answer cell is still the release stub."""


class AnswerCellError(AssertionError):
    """An exercise whose answer cell raised or did not parse."""


# Shown as `NotImplementedYet: ...` (not `labs.course.answers.NotImplementedYet: ...`) in pytest's
# one-line failure summary, so a learner reads the message, not our module path.
NotImplementedYet.__module__ = AnswerCellError.__module__ = "builtins"


@dataclass(slots=True)
class AnswerCell:
    grade_id: str
    source: str
    defines: list[str]
    error: str | None = None  # formatted error if the cell raised or did not parse
    not_implemented: bool = False  # the cell itself raised NotImplementedError


@dataclass(slots=True)
class NotebookAnswers:
    path: Path
    namespace: dict[str, Any]
    cells: list[AnswerCell] = field(default_factory=list)
    setup_error: str | None = None

    def cell_defining(self, name: str) -> AnswerCell | None:
        return next((cell for cell in self.cells if name in cell.defines), None)

    def get(self, name: str) -> Any:
        """The learner's object `name`; AssertionError (with a hint) if it is missing or broken."""
        cell = self.cell_defining(name)
        where = f"{self.path.name}"
        if self.setup_error is not None:
            raise AnswerCellError(f"the setup cells of {where} failed, fix them first:\n{self.setup_error}")
        if cell is None:
            raise AnswerCellError(
                f"no answer cell in {where} defines `{name}`: keep the `def {name}(...)` / "
                f"`class {name}` line of the exercise as given"
            )
        if cell.not_implemented:
            raise NotImplementedYet(f"`{name}` is not implemented yet: fill in answer cell {cell.grade_id!r}")
        if cell.error is not None:
            raise AnswerCellError(f"answer cell {cell.grade_id!r} (defining `{name}`) failed:\n{cell.error}")
        if name not in self.namespace:
            raise AnswerCellError(f"answer cell {cell.grade_id!r} ran but did not define `{name}`")
        return self.namespace[name]


def defined_names(source: str) -> list[str]:
    """Top-level def/class names in `source` (falls back to a regex when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return _DEFINITION.findall(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in tree.body if isinstance(node, kinds)]


def _format_error(error: BaseException, filename: str) -> str:
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno}): {(error.text or '').strip()}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    location = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    return f"{type(error).__name__}: {error}{location}"


def _run(source: str, namespace: dict[str, Any], filename: str) -> BaseException | None:
    # Register the cell's source under its pseudo file name: tracebacks show the learner's lines, and
    # compiled (GPU) Triton reads a @triton.jit function's source through inspect/linecache.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - running the learner's own cell
    except Exception as error:  # noqa: BLE001 - any failure belongs to this cell only
        return error
    return None


def _strip_magics(source: str) -> str:
    """IPython magics and shell escapes are not Python; drop them (setup cells may use %matplotlib)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def load_answers(path: str | Path) -> NotebookAnswers:
    from labs.course.notebook_format import read_notebook  # nbformat is slow to import: only when grading

    path = Path(path)
    notebook = read_notebook(path)
    answers = NotebookAnswers(path=path, namespace={"__name__": "__lab__"})
    # The cells' pseudo file names carry the notebook's full path: Triton's interpreter reads a kernel's
    # source back through linecache when it first runs, so two notebooks of the same phase loaded in one
    # process (phases/ and solutions/, as labs.assemble and its tests do) must not share a name.
    where = path.resolve()
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or "setup" not in cell.metadata.get("tags", []):
            continue
        filename = f"<{where} setup cell {index}>"
        error = _run(_strip_magics(cell.source), answers.namespace, filename)
        if error is not None:
            answers.setup_error = _format_error(error, filename)
            break
    for cell in notebook.cells:
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not grading.get("solution", False):
            continue
        grade_id = grading.get("grade_id", cell.get("id", "?"))
        answer = AnswerCell(grade_id=grade_id, source=cell.source, defines=defined_names(cell.source))
        filename = f"<{where} answer cell {grade_id}>"
        error = _run(_strip_magics(cell.source), answers.namespace, filename)
        if error is not None:
            answer.error = _format_error(error, filename)
            answer.not_implemented = isinstance(error, NotImplementedError)
        answers.cells.append(answer)
    return answers
