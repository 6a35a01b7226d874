"""The labs: one test per exercise of every phase, generated from the phase tables (labs/checks/pNN.py).

    pytest labs/                      grade the learner notebooks in phases/
    pytest labs/ --reference          grade the solutions (must all pass)
    pytest labs/ --notebooks DIR      grade DIR/NN_topic/NN_topic.ipynb
    pytest labs/ -k 01_paged_kv       one phase;  -k get_new_blocks  one exercise
    pytest labs/ -k free_block_queue  an exercise by the snake_case name of its check (FreeKVCacheBlockQueue)

Each test loads the answer cells of its phase's notebook (labs/course/answers.py: the setup cell, then
every answer cell on its own, so a broken cell fails only its own exercises) and runs the exercise's check
on what the learner defined, both in a child process with CPU-time and memory limits
(labs/checks/grading.py): a crash, a hang or a runaway allocation fails that exercise alone.
"""

from __future__ import annotations

import pytest

from labs.checks import p07
from labs.checks.grading import grade_exercise
from labs.manifest import all_phases

CASES = [
    pytest.param(phase.assignment_id, exercise, id=f"{phase.assignment_id}::{exercise.name}",
                 marks=[pytest.mark.skipif(not p07.TRITON_AVAILABLE, reason=p07.kernel_labs_message())]
                 if exercise.needs_triton else [])
    for phase in all_phases()
    for exercise in phase.exercises
]


@pytest.mark.parametrize(("assignment_id", "exercise"), CASES)
def test_exercise(notebook_path, assignment_id, exercise):
    grade_exercise(notebook_path(assignment_id), assignment_id, exercise)
