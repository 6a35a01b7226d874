"""Mirrors no vllm/v1 file: the learner's whole engine, assembled from their phase notebooks.

    from mini import LLM, SamplingParams
    from labs import assemble

    with assemble() as engine_parts:   # every answer you wrote, installed in the engine's roles
        llm = LLM()                    # build the engine INSIDE: the classes it builds (block queue, ...) are yours
        outputs = llm.generate(["def add(a, b):"], SamplingParams(temperature=0.0, max_tokens=8))
    engine_parts.report                # one Component per exercise: what the engine ran, and why

`assemble()` reads every phase notebook the way the labs grader does (labs/course/answers.py: the setup
cells, then each answer cell on its own), so a cell that does not parse or raises costs only its own
exercises. For each exercise of each phase table (labs/checks/pNN.py) it decides what the engine runs:

- `learner`: the answer is written and loaded; it is plugged into the exercise's part of an engine role (mini/roles.py);
- `reference (untouched)`: the answer is still the release stub (its body raises NotImplementedError);
- `reference (unfinished: NotImplementedError in ...)`: a class with some methods still stubs;
- `reference (failed to load: ...)`: the cell did not parse or raised while defining it, with the error;
- `reference (needs Triton: ...)`: a Triton kernel exercise on a machine where Triton cannot run;
- `reference (no notebook: ...)`, `reference (no part ...)`: the phase is missing, or the engine lacks the part;
- `not pluggable`: the exercise writes no part (a helper, an entry-point function); its code is still loaded,
  graded by `check()` and reported, with `(untouched)` / `(failed to load: ...)` when that applies.

The status always starts with what the engine runs (`learner`, `reference`) or `not pluggable`; the
parenthesis says why. Nothing about assembling is fatal: a missing notebook, a broken answer, even a
phase table that fails to import, becomes a row of the report.

The returned `EngineParts` is a context manager (`with engine_parts:` plugs every `learner` component, and
takes them out on exit, even after an error), can plug a subset (`engine_parts.plugged(names)`, what a
bisection needs), and grades itself (`engine_parts.check()`: each component's phase check on the learner's
code, timed against the reference on the same cases: the capstone's report card).

The capstone's own exercises mirror three helpers defined here: `first_divergence`,
`find_breaking_component` and `phase_scores`.

`labs/__init__.py` exports the function, so the attribute `labs.assemble` is the function, not this module:
`from labs.assemble import ...` works as usual; for the module object use
`importlib.import_module("labs.assemble")`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import html
import importlib
import inspect
import io
import os
import pkgutil
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labs.course.answers import borrowed_reference
from labs.manifest import Phase

__all__ = [
    "CheckResult",
    "Component",
    "EngineParts",
    "ReportCard",
    "assemble",
    "course_notebooks_dir",
    "find_breaking_component",
    "first_divergence",
    "phase_scores",
]

LEARNER = "learner"
UNTOUCHED = "reference (untouched)"
NOT_PLUGGABLE = "not pluggable"

_ASSIGNMENT = re.compile(r"^\d\d_[a-z0-9_]+$")
_REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- where the notebooks are
def _holds_phase_notebooks(folder: Path) -> bool:
    """True when `folder` holds at least one `NN_topic/NN_topic.ipynb` (a course's phases/ or solutions/)."""
    try:
        return any(_ASSIGNMENT.match(child.name) and (child / f"{child.name}.ipynb").is_file()
                   for child in folder.iterdir() if child.is_dir())
    except OSError:
        return False


def course_notebooks_dir(start: str | os.PathLike | None = None) -> Path:
    """The folder of phase notebooks to assemble from, seen from `start` (default: the working directory).

    A notebook runs with its own folder as working directory, so from `<folder>/17_capstone/` this is
    `<folder>`: `phases/` for a learner, `solutions/` when the source notebook runs (the course's tests,
    nbgrader's source), `submitted/<student>/` when an instructor runs a submission there. From anywhere
    else in a course (its root, `tests/`) it is the course's `phases/`; outside a course, the `phases/` of
    the course this package belongs to.
    """
    here = Path(start if start is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if _holds_phase_notebooks(folder):
            return folder
        if _holds_phase_notebooks(folder / "phases"):
            return folder / "phases"
    return _REPO_ROOT / "phases"


def _resolve_notebooks_dir(notebooks_dir: str | os.PathLike | None) -> Path:
    if notebooks_dir is None:
        return course_notebooks_dir()
    path = Path(notebooks_dir)
    if path.is_dir():
        return path.resolve()
    if not path.is_absolute():  # "phases" from inside the course (a notebook's folder): look upwards
        for folder in Path.cwd().resolve().parents:
            if (folder / path).is_dir():
                return folder / path
    raise FileNotFoundError(f"assemble({str(notebooks_dir)!r}): no such folder (from {Path.cwd()}); pass the "
                            "folder holding NN_topic/NN_topic.ipynb, e.g. the course's phases/ or solutions/")


# ---------------------------------------------------------------- the phase tables, tolerantly
def _phase_tables() -> tuple[list[Phase], list[tuple[str, str]]]:
    """Every phase table that imports, and (module, error) for those that do not (a phase being written)."""
    import labs.checks as checks_package

    phases, broken = [], []
    for module_info in sorted(pkgutil.iter_modules(checks_package.__path__), key=lambda m: m.name):
        name = module_info.name
        if not (name.startswith("p") and name[1:].isdigit()):
            continue
        try:
            module = importlib.import_module(f"labs.checks.{name}")
        except Exception as error:  # noqa: BLE001 - a phase under construction must not stop the others
            broken.append((name, f"{type(error).__name__}: {error}"))
            continue
        phase = getattr(module, "PHASE", None)
        if isinstance(phase, Phase):
            phases.append(phase)
        else:
            broken.append((name, "defines no PHASE = Phase(...)"))
    return phases, broken


# ---------------------------------------------------------------- is an answer still the stub?
def _raises_not_implemented(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True when the body reaches `raise NotImplementedError` unconditionally (the release stub)."""
    for statement in function.body:
        if isinstance(statement, ast.Return):
            return False
        if isinstance(statement, ast.Raise) and statement.exc is not None:
            raised = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            if isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                return True
    return False


def stub_functions(source: str, name: str) -> tuple[list[str], int]:
    """(the stub functions, how many functions) of the top-level definition `name` in `source`.

    A function counts itself; a class counts its methods. ([], 0) when `name` is not found or the
    source does not parse (the loader reports that error)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [], 0
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and node.name == name:
            return ([name] if _raises_not_implemented(node) else []), 1
        if isinstance(node, ast.ClassDef) and node.name == name:
            methods = [item for item in node.body if isinstance(item, functions)]
            return [m.name for m in methods if _raises_not_implemented(m)], len(methods)
    return [], 0


# ---------------------------------------------------------------- loading notebooks (cached)
_ANSWERS_CACHE: dict[tuple[str, int, int], Any] = {}


def _load_notebook(path: Path) -> Any:
    """labs.course.answers.load_answers, quietly, cached by (path, mtime, size): edit and save to reload."""
    from labs.course.answers import load_answers

    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _ANSWERS_CACHE:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _ANSWERS_CACHE[key] = load_answers(path)
    return _ANSWERS_CACHE[key]


def _first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 4] + " ..."


# ---------------------------------------------------------------- the report
@dataclass(frozen=True, slots=True)
class Component:
    """One exercise of one phase, as the assembled engine uses it."""

    phase: str                  # assignment id, e.g. "10_prefix_caching"
    exercise: str               # what the answer cell defines, e.g. "hash_block_tokens"
    part: str | None            # the part of an engine role it writes (mini/roles.py; None: not pluggable)
    status: str                 # "learner", "reference (why)" or "not pluggable[ (why)]"
    implementation: Any = None  # the learner's object when it is written and loaded (plugged or not)
    points: int = 0
    check: Callable[..., None] | None = field(default=None, repr=False)
    needs_triton: bool = False

    @property
    def kind(self) -> str:
        """What the engine runs for it: "learner", "reference" or "not pluggable"."""
        return self.status.split(" (")[0]

    @property
    def is_learner(self) -> bool:
        return self.status == LEARNER

    @property
    def name(self) -> str:
        """The name a subset is selected by: the part where there is one, else the exercise."""
        return self.part or self.exercise


def _components_of(phase: Phase, notebooks_dir: Path, parts_available: set[str],
                   triton_reason: str | None) -> list[Component]:
    path = notebooks_dir / phase.assignment_id / f"{phase.assignment_id}.ipynb"
    answers, notebook_error = None, None
    if not path.is_file():
        notebook_error = f"no notebook: {path}"
    else:
        try:
            answers = _load_notebook(path)
        except Exception as error:  # noqa: BLE001 - an unreadable notebook is one phase's problem
            notebook_error = f"failed to load: {type(error).__name__}: {_first_line(str(error))}"
        else:
            if answers.setup_error is not None:
                notebook_error = f"failed to load: setup cell: {_first_line(answers.setup_error)}"
    components = []
    for exercise in phase.exercises:
        row = Component(phase.assignment_id, exercise.name, exercise.part, "", points=exercise.points,
                        check=exercise.check, needs_triton=exercise.needs_triton)
        why, implementation = _why_not_learner(exercise.name, answers, notebook_error)
        if exercise.part is None:
            status = NOT_PLUGGABLE if why is None else f"{NOT_PLUGGABLE} ({why})"
        elif why is not None:
            status = f"reference ({why})"
        elif exercise.needs_triton and triton_reason is not None:
            status = f"reference (needs Triton: {triton_reason})"
        elif exercise.part not in parts_available:
            status = f"reference (no part {exercise.part!r} in this engine)"
        else:
            status = LEARNER
        components.append(replace(row, status=status, implementation=implementation))
    return components


def _why_not_learner(name: str, answers: Any, notebook_error: str | None) -> tuple[str | None, Any]:
    """(None, the learner's object) when it is written and loaded, else (why not, None)."""
    if notebook_error is not None:
        return notebook_error, None
    cell = answers.cell_defining(name)
    if cell is None:
        return f"failed to load: no answer cell defines `{name}`", None
    if cell.not_implemented:
        return "untouched", None
    if cell.error is not None:
        return f"failed to load: {_first_line(cell.error)}", None
    if name not in cell.namespace:
        return f"failed to load: the cell ran but did not define `{name}`", None
    stubs, num_functions = stub_functions(cell.source, name)
    if stubs and len(stubs) == num_functions:
        return "untouched", None
    if stubs:
        return f"unfinished: NotImplementedError in {', '.join(stubs)}", None
    value = cell.namespace[name]  # what its own cell bound (labs/course/answers.py), not a later cell's import
    borrowed = borrowed_reference(name, value, cell.source, cell.namespace)
    if borrowed is not None:
        return f"not yours: {borrowed}", None
    return None, value


def _why(status: str) -> str:
    """The parenthesis of a status ("" when there is none)."""
    return status.partition(" (")[2].removesuffix(")")


def _triton_unusable_reason() -> str | None:
    from mini.attention import triton_utils

    return None if triton_utils.is_available() else _first_line(triton_utils.unavailable_reason(), 120)


# ---------------------------------------------------------------- the report card
@dataclass(frozen=True, slots=True)
class CheckResult:
    """One component's phase check, run on the learner's code (one row of the report card)."""

    phase: str
    exercise: str
    points: int
    outcome: str          # "passed", "failed", "not implemented" or "skipped"
    message: str = ""     # why it failed / was skipped (the first line of the check's message)
    learner_s: float | None = None    # time spent inside the learner's function during the check
    reference_s: float | None = None  # the same for the reference, on the same cases

    @property
    def speed_ratio(self) -> float | None:
        """learner time / reference time on the check's cases (> 1: slower than mini); None if not timed."""
        if self.learner_s is None or not self.reference_s:
            return None
        return self.learner_s / self.reference_s


class ReportCard(list):
    """A list of CheckResult that draws itself as a table in a notebook."""

    def _rows(self) -> list[tuple[str, ...]]:
        rows = []
        for result in self:
            ratio = result.speed_ratio
            rows.append((result.phase, result.exercise, str(result.points), result.outcome,
                         "" if ratio is None else f"{ratio:.2f}x", result.message))
        return rows

    def __str__(self) -> str:
        header = ("phase", "exercise", "points", "outcome", "time vs mini", "note")
        return _text_table(header, self._rows())

    def _repr_html_(self) -> str:
        header = ("phase", "exercise", "points", "outcome", "time vs mini", "note")
        colors = {"passed": "#d9f2d9", "failed": "#f8d0d0", "not implemented": "#eeeeee", "skipped": "#fff3cd"}
        return _html_table(header, self._rows(), lambda row: colors.get(row[3], ""))


def _timed(function: Callable, clock: list[float]) -> Callable:
    """`function`, adding the seconds spent inside each call to clock[0]."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            clock[0] += time.perf_counter() - start

    return timed


def _run_check(check: Callable, candidate: Any, seeds: Iterable[int]) -> tuple[str, str, float | None]:
    """(outcome, message, seconds inside the candidate) of one check run, its printing swallowed."""
    from labs.course.answers import NotImplementedYet

    clock = [0.0]
    timed = inspect.isfunction(candidate)
    subject = _timed(candidate, clock) if timed else candidate
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            check(subject, seeds=seeds)
        except NotImplementedYet as error:
            return "not implemented", _first_line(str(error)), None
        except AssertionError as error:
            return "failed", _first_line(str(error)), None
        except Exception as error:  # noqa: BLE001 - a check that crashes on odd learner code is a failure
            return "failed", f"{type(error).__name__}: {_first_line(str(error))}", None
    return "passed", "", clock[0] if timed else None


# ---------------------------------------------------------------- EngineParts
class EngineParts:
    """The learner's engine components, ready to plug: a context manager, a report, and a report card."""

    def __init__(self, notebooks_dir: Path, report: list[Component]) -> None:
        self.notebooks_dir = notebooks_dir
        self.report = report
        self._plugs: list[contextlib.ExitStack] = []

    # -- what is what
    @property
    def learner(self) -> list[Component]:
        """The components the engine runs from the learner's notebooks."""
        return [c for c in self.report if c.is_learner]

    @property
    def reference(self) -> list[Component]:
        """Pluggable components for which the engine keeps its own code (see each status for why)."""
        return [c for c in self.report if c.kind == "reference"]

    @property
    def not_pluggable(self) -> list[Component]:
        return [c for c in self.report if c.kind == NOT_PLUGGABLE]

    @property
    def missing(self) -> list[Component]:
        """Components the learner has not (successfully) written: untouched, unfinished, failed, absent."""
        return [c for c in self.report if c.implementation is None]

    @property
    def replacements(self) -> dict[str, Any]:
        """part name -> the learner's object, for every `learner` component."""
        return {c.part: c.implementation for c in self.learner}

    def component(self, name: str) -> Component:
        """The component whose part or exercise is `name` (an exercise name shared by two phases: the first)."""
        for component in self.report:
            if name in (component.part, component.exercise):
                return component
        raise KeyError(f"no component named {name!r}")

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for component in self.report:
            counts[component.kind] = counts.get(component.kind, 0) + 1
        parts = [f"{counts.get(kind, 0)} {label}" for kind, label in
                 ((LEARNER, "yours (plugged)"), ("reference", "the reference's"), (NOT_PLUGGABLE, "not pluggable"))]
        return (f"{len(self.report)} components from {self.notebooks_dir}: {', '.join(parts)}; "
                f"{len(self.missing)} not written yet or not loading")

    # -- plugging
    def plugged(self, names: Iterable[str] | None = None) -> contextlib.AbstractContextManager[None]:
        """Plug the learner components named in `names` (part names; None: all of them) for a `with` block."""
        from labs.plugging import plug

        replacements = self.replacements
        if names is not None:
            wanted = list(names)
            unknown = [name for name in wanted if name not in replacements]
            if unknown:
                raise ValueError(f"not learner components: {unknown}; learner components: {sorted(replacements)}")
            replacements = {name: replacements[name] for name in wanted}
        return plug(**replacements)

    def __enter__(self) -> EngineParts:  # noqa: PYI034 - Self needs Python 3.11
        stack = contextlib.ExitStack()
        stack.enter_context(self.plugged())
        self._plugs.append(stack)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._plugs.pop().close()

    def with_replaced(self, **replacements: Any) -> EngineParts:
        """A copy in which each named part runs the given object instead (a deliberately broken part, say)."""
        report = list(self.report)
        for part_name, replacement in replacements.items():
            index = next((i for i, c in enumerate(report) if c.part == part_name), None)
            if index is None:
                raise ValueError(f"no component fills part {part_name!r}")
            report[index] = replace(report[index], status=LEARNER, implementation=replacement)
        return EngineParts(self.notebooks_dir, report)

    # -- the report card
    def check(self, seeds: Iterable[int] = range(1), time_reference: bool = True,
              only: Iterable[str] | None = None) -> ReportCard:
        """Run each component's phase check on the learner's code (`seeds`: as the checks take them).

        Untouched components are "not implemented" without running; Triton exercises where Triton cannot
        run are "skipped". For a plain function that is a part, the time spent inside it during its check is
        compared with the reference's time on the same cases (the check run again on the reference).
        `only`: the part or exercise names to check (default: every component)."""
        from mini import roles

        seeds = list(seeds)
        wanted = None if only is None else set(only)
        card = ReportCard()
        for component in self.report:
            if wanted is not None and not wanted & {component.part, component.exercise}:
                continue
            base = CheckResult(component.phase, component.exercise, component.points, "not implemented")
            if component.needs_triton and _triton_unusable_reason() is not None:
                card.append(replace(base, outcome="skipped", message="needs Triton"))
                continue
            if component.implementation is None or component.check is None:
                reason = _why(component.status)
                failed = reason.startswith(("failed to load", "not yours"))
                card.append(replace(base, outcome="failed" if failed else "not implemented",
                                    message="" if reason == "untouched" else reason))
                continue
            outcome, message, learner_s = _run_check(component.check, component.implementation, seeds)
            reference_s = None
            if (outcome == "passed" and learner_s is not None and time_reference and component.part
                    and component.part in roles.part_names() and inspect.isfunction(roles.reference(component.part))):
                # The first run also warmed up what the cases touch (allocator, lazy imports, caches): time the
                # reference now, then the learner again, and keep the learner's faster run.
                ref_outcome, _, reference_s = _run_check(component.check, roles.reference(component.part), seeds)
                reference_s = reference_s if ref_outcome == "passed" else None
                again_outcome, _, again_s = _run_check(component.check, component.implementation, seeds)
                if again_outcome == "passed" and again_s is not None:
                    learner_s = min(learner_s, again_s)
            card.append(replace(base, outcome=outcome, message=message,
                                learner_s=learner_s if reference_s is not None else None,
                                reference_s=reference_s))
        return card

    # -- display
    def _rows(self) -> list[tuple[str, ...]]:
        return [(c.phase, c.exercise, c.part or "-", c.status) for c in self.report]

    def __str__(self) -> str:
        return self.summary() + "\n" + _text_table(("phase", "exercise", "part", "status"), self._rows())

    def __repr__(self) -> str:
        return f"<EngineParts {self.summary()}>"

    def _repr_html_(self) -> str:
        colors = {LEARNER: "#d9f2d9", "reference": "#eeeeee", NOT_PLUGGABLE: "#e8eef8"}
        table = _html_table(("phase", "exercise", "part", "status"), self._rows(),
                            lambda row: "#f8d0d0" if "failed" in row[3] else colors.get(row[3].split(" (")[0], ""))
        return f"<p>{html.escape(self.summary())}</p>{table}"


def assemble(notebooks_dir: str | os.PathLike | None = None, *, include_capstone: bool = False) -> EngineParts:
    """Collect every answer written in the phase notebooks of `notebooks_dir`, ready to plug into the engine.

    `notebooks_dir` holds `NN_topic/NN_topic.ipynb` (a course's `phases/`, `solutions/` or a student's
    folder); None: `course_notebooks_dir()` (from a notebook in `phases/17_capstone/`: `phases/`). A relative
    name such as "phases" is also looked up in the folders above the working directory. The capstone's own
    exercises build no engine part and are left out unless `include_capstone`.
    """
    from labs.plugging import lab_names

    folder = _resolve_notebooks_dir(notebooks_dir)
    phases, broken = _phase_tables()
    parts_available = set(lab_names())
    triton_reason = _triton_unusable_reason()
    report: list[Component] = []
    for phase in phases:
        if phase.assignment_id.endswith("_capstone") and not include_capstone:
            continue
        report += _components_of(phase, folder, parts_available, triton_reason)
    for module_name, error in broken:
        report.append(Component(module_name, "*", None,
                                f"reference (phase table failed to load: {_first_line(error)})"))
    return EngineParts(folder, report)


# ---------------------------------------------------------------- the capstone's exercises, reference versions
def first_divergence(expected: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """(prompt index, token position) of the first difference between two runs' outputs; None if identical.

    Prompts are compared in order; within one, the first position where the tokens differ, or the length
    of the shorter sequence when one is a prefix of the other."""
    if len(expected) != len(got):
        raise ValueError(f"expected {len(expected)} outputs and got {len(got)}: compare runs of the same prompts")
    for index, (want, have) in enumerate(zip(expected, got, strict=False)):
        for position, (a, b) in enumerate(zip(want, have, strict=False)):
            if a != b:
                return index, position
        if len(want) != len(have):
            return index, min(len(want), len(have))
    return None


def find_breaking_component(components: Sequence[str], is_exact: Callable[[list[str]], bool]) -> str | None:
    """The one component that breaks exactness, by halving; None when all of them together are exact.

    `is_exact(subset)` runs the engine with only `subset` plugged in and says whether its output equals
    the reference's. At most one component is broken: a subset is exact iff it does not contain it. Uses
    at most 1 + ceil(log2(len(components))) calls."""
    suspects = list(components)
    if not suspects or is_exact(list(suspects)):
        return None
    while len(suspects) > 1:
        half = suspects[: len(suspects) // 2]
        suspects = half if not is_exact(list(half)) else suspects[len(half):]
    return suspects[0]


def phase_scores(results: Iterable[Any]) -> dict[str, tuple[int, int]]:
    """phase -> (points earned, points possible), phases in order of first appearance.

    A "passed" result earns its points; any other outcome earns 0; a "skipped" one (a kernel exercise where
    Triton cannot run) counts toward neither."""
    scores: dict[str, tuple[int, int]] = {}
    for result in results:
        earned, possible = scores.get(result.phase, (0, 0))
        if result.outcome != "skipped":
            possible += result.points
            if result.outcome == "passed":
                earned += result.points
        scores[result.phase] = (earned, possible)
    return scores


# ---------------------------------------------------------------- tables
def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    widths[-1] = 0  # the last column is free text
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip()
             for line in (header, *rows)]
    return "\n".join(lines)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], color: Callable[[Sequence[str]], str]) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        background = color(row)
        style = f" style='background:{background}'" if background else ""
        cells = "".join(f"<td style='text-align:left'>{html.escape(str(cell))}</td>" for cell in row)
        body.append(f"<tr{style}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
