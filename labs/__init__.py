"""The course beside the engine: everything a learner and an instructor use, none of which `mini` imports.

- `labs.checks.pNN`: each phase's checks and its table of exercises (`PHASE`, see `labs.manifest`);
- `labs.plug`: build the engine with the learner's code as parts of its roles (`labs/plugging.py`, `mini/roles.py`);
- `labs.assemble`: every answer of every phase notebook plugged at once: the learner's whole engine, with a
  report of which parts are theirs (`labs/assemble.py`, the capstone);
- `labs.views`: the widgets and plots the notebooks draw;
- `labs.course`: the nbgrader release pipeline (`python -m labs.course release|check|list`) and the
  answer loader the grader uses;
- `labs/test_labs.py`: `pytest labs/`, one test per exercise, generated from the phase tables.

See docs/authoring.md for how a phase is written.

Importing `labs` chooses the engine-core mode of the course: every engine built afterwards runs its core in this
process (`MINI_ENABLE_V1_MULTIPROCESSING=0`, vLLM's `VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the views, the
checks and the learner's plugged parts can look inside it, unless the environment already set the switch.
Every notebook's setup cell starts with `import labs`, so no cell has to remember the variable; phase 14
builds its engines with the core in a child process explicitly (mini's default, as vLLM's).
"""

import os

os.environ.setdefault("MINI_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the course never downloads: every model ships or is built locally

from labs.assemble import assemble
from labs.plugging import lab_names, plug

__all__ = ["assemble", "lab_names", "plug"]
