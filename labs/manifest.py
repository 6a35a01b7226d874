"""One table per phase: what the learner writes, how it is graded, where it plugs into the engine.

Each `labs/checks/pNN.py` ends with a `PHASE = Phase(...)` table (a check module imports no other phase's:
what phases share is labs/checks/common.py). Everything else is generated from it:
the lab tests (`labs/test_labs.py`, one parametrised test per exercise), the names `labs.plug` accepts,
and the consistency tests that hold the table, the notebook's nbgrader cells and the engine's roles
together (tests/course/test_plug.py, test_release.py, test_lab_prose.py). Adding a phase means: the
notebook, its checks module with its table, and the README's phase map.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Exercise:
    """One graded exercise of a phase notebook."""

    name: str              # what the answer cell defines (same name as mini's reference, where there is one)
    check: Callable[..., None]  # check(candidate, seeds=...) -> None, raises AssertionError on a mismatch
    points: int            # the points of its nbgrader test cell
    grade_id: str          # the grade id of that test cell
    part: str | None = None  # the part of an engine role it writes (mini/roles.py; None: not pluggable)
    needs_triton: bool = False  # graded only where Triton runs (Linux x86_64)
    handle_name: str = ""  # its `-k` handle after `pNN_` (default: its check's name without `check_`)
    design: str = ""  # what the learner designs that the notebook leaves open ("": follows a given contract)

    @property
    def keywords(self) -> tuple[str, ...]:
        """Other names `pytest labs/ -k` selects this exercise by, besides its test id: the snake_case name
        of its check (`check_free_block_queue` -> `free_block_queue`), its own name in snake_case
        (`FreeKVCacheBlockQueue` -> `free_kv_cache_block_queue`) and its grade id (`test-free-block-queue`)."""
        check_name = getattr(self.check, "__name__", "").removeprefix("check_")
        snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", self.name).lower()
        names = (check_name, snake, self.grade_id, self.grade_id.removeprefix("test-").replace("-", "_"))
        return tuple(dict.fromkeys(n for n in names if n and n != self.name))

    def handle(self, assignment_id: str) -> str:
        """The name `pytest labs/ -k <handle>` selects this exercise alone by: `pNN_<name>`, unique in the
        course and part of no other exercise's names (`-k` matches substrings), e.g. `p05_schedule`."""
        name = self.handle_name or getattr(self.check, "__name__", "").removeprefix("check_")
        return f"p{assignment_id[:2]}_{name}"


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase notebook (assignment id `NN_topic`) and its exercises, in notebook order."""

    assignment_id: str
    exercises: tuple[Exercise, ...]

    def exercise(self, name: str) -> Exercise:
        for exercise in self.exercises:
            if exercise.name == name:
                return exercise
        raise KeyError(f"phase {self.assignment_id} has no exercise {name!r}; "
                       f"exercises: {[e.name for e in self.exercises]}")


def all_phases() -> list[Phase]:
    """Every phase table found in labs/checks/p*.py, in phase order."""
    import labs.checks as checks_package

    phases = []
    for module_info in sorted(pkgutil.iter_modules(checks_package.__path__), key=lambda m: m.name):
        if module_info.name.startswith("p") and module_info.name[1:].isdigit():
            module = importlib.import_module(f"labs.checks.{module_info.name}")
            phase: Any = getattr(module, "PHASE", None)
            if not isinstance(phase, Phase):
                raise TypeError(f"labs/checks/{module_info.name}.py must define PHASE = Phase(...)")
            phases.append(phase)
    return phases


def part_exercises() -> dict[str, Exercise]:
    """part name -> the exercise that writes it (each part belongs to exactly one exercise)."""
    found: dict[str, Exercise] = {}
    for phase in all_phases():
        for exercise in phase.exercises:
            if exercise.part is not None:
                if exercise.part in found:
                    raise ValueError(f"part {exercise.part!r} is claimed by two exercises")
                found[exercise.part] = exercise
    return found
