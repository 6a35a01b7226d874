"""Mirrors no vllm/v1 file: read a learner's answers out of a notebook without running the notebook.

The labs grader (labs/conftest.py) needs the functions and classes a learner wrote, and nothing
else: no widgets, no engine runs. So it

1. runs the notebook's setup cells (code cells tagged "setup": imports, constants) in one namespace;
2. runs each nbgrader answer cell (metadata nbgrader.solution = true, code) in its OWN try block, in its
   own copy of the namespace so far, recording the error of a cell that raises or does not parse;
3. maps every top-level `def`/`class` name to the answer cell that defines it.

An answer cell that fails therefore fails only the exercises whose names it defines. An exercise is graded on
the object ITS OWN cell bound to its name, and that object's code sees the names as they were when the cell
ran: a later cell that imports mini's reference under the same name replaces neither. An answer that is not
the learner's code (the cell imports mini's reference, or the function hands its work to it) is reported as
such instead of graded.
"""

from __future__ import annotations

import ast
import inspect
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


LAB_MODULE = "__lab__"  # the __name__ of the namespace the answer cells run in


@dataclass(slots=True)
class AnswerCell:
    grade_id: str
    source: str
    defines: list[str]
    error: str | None = None  # formatted error if the cell raised or did not parse
    not_implemented: bool = False  # the cell itself raised NotImplementedError
    binds: list[str] = field(default_factory=list)  # names its top-level imports and assignments bind
    namespace: dict[str, Any] = field(default_factory=dict)  # the names as this cell left them


@dataclass(slots=True)
class NotebookAnswers:
    path: Path
    namespace: dict[str, Any]
    cells: list[AnswerCell] = field(default_factory=list)
    setup_error: str | None = None

    def cell_defining(self, name: str) -> AnswerCell | None:
        """The answer cell that defines `name` (a def or class), else the first one that binds it otherwise."""
        return (next((cell for cell in self.cells if name in cell.defines), None)
                or next((cell for cell in self.cells if name in cell.binds), None))

    def get(self, name: str) -> Any:
        """The learner's object `name`; AssertionError (with a hint) if it is missing, broken or not theirs."""
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
        if name not in cell.namespace:
            raise AnswerCellError(f"answer cell {cell.grade_id!r} ran but did not define `{name}`")
        value = cell.namespace[name]
        borrowed = borrowed_reference(name, value, cell.source, cell.namespace)
        if borrowed is not None:
            raise AnswerCellError(
                f"answer cell {cell.grade_id!r} does not implement `{name}`: {borrowed}. The exercise grades "
                f"code you write: keep the `def {name}(...)` / `class {name}` of the exercise and write its body"
            )
        return value


def defined_names(source: str) -> list[str]:
    """Top-level def/class names in `source` (falls back to a regex when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return _DEFINITION.findall(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in tree.body if isinstance(node, kinds)]


def bound_names(source: str) -> list[str]:
    """Names the top-level imports and assignments of `source` bind (empty when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [alias.asname or alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    return names


def _is_mini(value: Any) -> bool:
    module = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "mini" or module.startswith("mini."))


def borrowed_reference(name: str, value: Any, source: str, namespace: dict[str, Any]) -> str | None:
    """Why `value`, bound to `name` by an answer cell, is mini's reference rather than the learner's code, or
    None: the object itself comes from mini (an import, a subclass of mini's class of that name), or its code
    calls mini's `name` (`attn.store_kv(...)`, `BlockPool.get_new_blocks(self, ...)`, `reference("name")`)."""
    target = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if _is_mini(target):
        origin = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', name)}"
        return f"it binds `{name}` to mini's own `{origin}`"
    if inspect.isclass(target) and not any(inspect.isfunction(v) for v in vars(target).values()):
        # Subclassing the reference to override a method is how some exercises are set; a subclass that
        # writes no method of its own is the reference under another name.
        for base in target.__mro__[1:]:
            if base.__name__ == name and _is_mini(base):
                return f"`{name}` subclasses mini's own `{base.__module__}.{base.__qualname__}` and writes nothing"
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    definitions = [node for node in tree.body if getattr(node, "name", None) == name]
    if inspect.isclass(target) and any(_is_mini(base) for base in target.__mro__[1:]):
        for method in (m for d in definitions if isinstance(d, ast.ClassDef) for m in d.body
                       if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("__")):
            for node in ast.walk(method):
                if (isinstance(node, ast.Attribute) and node.attr == method.name and isinstance(node.value, ast.Call)
                        and getattr(node.value.func, "id", None) == "super"):
                    return f"its `{method.name}` calls mini's own through `super().{method.name}(...)`"
    for node in (inner for definition in definitions for inner in ast.walk(definition)):
        if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name):
            owner = namespace.get(node.value.id)
            if owner is not None and _is_mini(owner):
                return f"its code calls mini's own `{node.value.id}.{name}`"
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "reference"
                and any(isinstance(a, ast.Constant) and a.value == name for a in node.args)):
            return f"its code asks mini for the reference `{name}` (`reference({name!r})`)"
    return None


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
    answers = NotebookAnswers(path=path, namespace={"__name__": LAB_MODULE})
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
    namespace = answers.namespace
    for cell in notebook.cells:
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not grading.get("solution", False):
            continue
        grade_id = grading.get("grade_id", cell.get("id", "?"))
        # Its own copy of the names so far: what its functions see stays as this cell left it.
        namespace = dict(namespace)
        answer = AnswerCell(grade_id=grade_id, source=cell.source, defines=defined_names(cell.source),
                            binds=bound_names(cell.source), namespace=namespace)
        filename = f"<{where} answer cell {grade_id}>"
        error = _run(_strip_magics(cell.source), namespace, filename)
        if error is not None:
            answer.error = _format_error(error, filename)
            answer.not_implemented = isinstance(error, NotImplementedError)
        answers.cells.append(answer)
    answers.namespace = dict(namespace)  # every name as the last answer cell left it
    return answers


def setup_modules(path: str | Path) -> list[str]:
    """The modules the notebook's setup cells import from the course's own stack (mini, labs, torch, ...),
    read without running anything: a grader imports them once before it forks a child per exercise."""
    from labs.course.notebook_format import read_notebook

    modules = []
    for cell in read_notebook(path).cells:
        if cell.cell_type != "code" or "setup" not in cell.metadata.get("tags", []):
            continue
        try:
            tree = ast.parse(_strip_magics(cell.source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.append(node.module)
    known = ("mini", "labs", "torch", "transformers", "numpy", "triton")
    return [m for m in dict.fromkeys(modules) if m.split(".")[0] in known]
