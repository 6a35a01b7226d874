"""Every exercise of every phase has at least five of our own wrong answers that its check must reject
(tests/course/wrong_answers/test_pNN.py, each a `WRONG` list of `tests.course.fidelity.Wrong`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from labs.manifest import all_phases

TESTS = Path(__file__).resolve().parent
MIN_WRONG_ANSWERS = 5


def _wrong_answers_by_phase() -> dict[str, list]:
    found: dict[str, list] = {}
    for path in sorted(TESTS.glob("test_p[0-9][0-9].py")):
        spec = importlib.util.spec_from_file_location(f"_wrong_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[path.stem.rsplit("_", 1)[-1][1:]] = list(module.WRONG)
    return found


def test_every_exercise_has_wrong_answers_its_check_rejects():
    by_phase = _wrong_answers_by_phase()
    short = []
    for phase in all_phases():
        number = phase.assignment_id[:2]
        wrongs = by_phase.get(number, [])
        for exercise in phase.exercises:
            count = sum(w.exercise == exercise.name for w in wrongs)
            if count < MIN_WRONG_ANSWERS:
                short.append(f"{phase.assignment_id}::{exercise.name} ({count})")
    assert not short, f"exercises with fewer than {MIN_WRONG_ANSWERS} wrong answers: {short}"


def test_every_wrong_answer_names_a_real_exercise():
    names = {(p.assignment_id[:2], e.name) for p in all_phases() for e in p.exercises}
    stray = [(number, w.exercise) for number, wrongs in _wrong_answers_by_phase().items() for w in wrongs
             if (number, w.exercise) not in names]
    assert not stray, stray
