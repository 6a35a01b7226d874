"""`pytest labs/` as a learner runs it (in a subprocess): the untouched release fails every exercise with
"not implemented yet" and nothing errors; a filled-in, broken or wrong cell changes only its exercise. The
notebooks graded are the release as generated into a temporary folder, not the checkout's phases/ (where a
learner's answers live); `-k` selects an exercise by its name or its snake_case name.

(`pytest labs/ --reference`, the solutions passing every lab, is part of the project's test command
itself: `pytest tests labs --reference`.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from patience import RUN_GUARD_S

from labs.checks import p02
from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT, write_release
from labs.manifest import all_phases


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory) -> Path:
    """The release as generated from solutions/ (what a fresh clone's phases/ holds). Never the checkout's
    phases/: a learner works there, and their answers must not fail the project's tests."""
    return write_release(tmp_path_factory.mktemp("release"))


def run_labs(tmp_path: Path, *args: str) -> dict[str, tuple[str, str]]:
    """Run pytest on labs/ and return {test name: (outcome, failure message)} from its JUnit report."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*.xml')))}.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args]
    result = subprocess.run(
        command, check=False, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_GUARD_S
    )
    assert report.exists(), f"pytest produced no report:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        if error is not None:
            outcomes[case.get("name")] = ("error", error.get("message", ""))
        elif failure is not None:
            outcomes[case.get("name")] = ("failed", failure.get("message", "") + (failure.text or ""))
        elif case.find("skipped") is not None:
            outcomes[case.get("name")] = ("skipped", case.find("skipped").get("message", ""))
        else:
            outcomes[case.get("name")] = ("passed", "")
    assert "error" not in result.stdout.splitlines()[-1], result.stdout[-3000:]
    return outcomes


def test_untouched_release_fails_every_lab_with_not_implemented(tmp_path, release_dir):
    outcomes = run_labs(tmp_path, "labs/", "--notebooks", str(release_dir))
    assert len(outcomes) == sum(len(phase.exercises) for phase in all_phases())
    for name, (outcome, message) in outcomes.items():
        assert outcome == "failed", (name, outcome, message)
        assert "not implemented yet" in message, (name, message)


def _phase_copy(tmp_path: Path, release_dir: Path, assignment_id: str) -> Path:
    target = tmp_path / "notebooks" / assignment_id
    shutil.copytree(release_dir / assignment_id, target)
    return target / f"{assignment_id}.ipynb"


def test_filled_broken_and_wrong_cells_change_only_their_exercises(tmp_path, release_dir):
    assignment_id = "02_slot_mapping"
    solution = read_notebook(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")
    solved = {c.id: c.source for c in solution.cells}
    path = _phase_copy(tmp_path, release_dir, assignment_id)
    notebook = read_notebook(path)
    for cell in notebook.cells:
        if cell.id == "answer-slot-mapping":  # exercise 3 filled in
            cell.source = solved[cell.id]
        elif cell.id == "answer-positions":  # exercise 2 does not parse
            cell.source = "def compute_positions(num_computed_tokens, num_scheduled_tokens)\n    return 1\n"
        elif cell.id == "answer-query-start-loc":  # exercise 1 forgets the leading 0
            cell.source = (
                "def compute_query_start_loc(num_scheduled_tokens):\n"
                "    return torch.cumsum(torch.tensor(num_scheduled_tokens), 0).int()\n"
            )
    write_normalized(notebook, path)

    outcomes = run_labs(tmp_path, "labs/", "-k", assignment_id, "--notebooks", str(tmp_path / "notebooks"))
    outcomes = {name.split("::")[-1].rstrip("]"): value for name, value in outcomes.items()}
    assert set(outcomes) == {e.name for e in p02.PHASE.exercises}
    assert outcomes["compute_slot_mapping"][0] == "passed"
    outcome, message = outcomes["compute_positions"]
    assert outcome == "failed" and "SyntaxError" in message, message
    outcome, message = outcomes["prepare_inputs"]
    assert outcome == "failed" and "not implemented yet" in message, message
    outcome, message = outcomes["compute_query_start_loc"]
    assert outcome == "failed"
    for expected in (
        "inputs:",
        "num_scheduled_tokens = [5, 7, 3]",
        "expected: [0, 5, 12, 15]",
        "got:      [5, 12, 15]",
        "hint:",
    ):
        assert expected in message, message


def test_phases_a_student_did_not_submit_are_skipped_as_not_submitted(tmp_path, release_dir):
    """`pytest labs/ --notebooks submitted/<student>`: a phase missing from the folder is skipped ("not
    submitted"), not failed; a submitted phase is graded as usual."""
    student = tmp_path / "submitted" / "ada"
    shutil.copytree(release_dir / "02_slot_mapping", student / "02_slot_mapping")
    outcomes = run_labs(tmp_path, "labs/", "-k", "01_paged_kv or 02_slot_mapping", "--notebooks", str(student))
    graded = {name: value for name, value in outcomes.items() if "02_slot_mapping" in name}
    missing = {name: value for name, value in outcomes.items() if "01_paged_kv" in name}
    assert len(missing) == len(all_phases()[1].exercises) and len(graded) == len(p02.PHASE.exercises)
    for name, (outcome, message) in missing.items():
        assert outcome == "skipped" and "not submitted" in message, (name, outcome, message)
    for name, (outcome, message) in graded.items():
        assert outcome == "failed" and "not implemented yet" in message, (name, outcome, message)



HANDLE_PROBE = """
import json, os
import pytest
from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    from labs.manifest import all_phases
    handles = [e.handle(p.assignment_id) for p in all_phases() for e in p.exercises]
    selected = {h: [i.nodeid for i in items if Expression.compile(h).evaluate(KeywordMatcher.from_item(i))]
                for h in handles}
    with open(os.environ["HANDLE_PROBE_OUT"], "w") as out:
        json.dump(selected, out)
"""


def _collect(tmp_path: Path, *args: str, probe: bool = False) -> list[str]:
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "HANDLE_PROBE_OUT": str(tmp_path / "handles.json")}
    extra = ["-p", "handle_probe"] if probe else []
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "labs/", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_GUARD_S, check=False,
    )
    return [line for line in result.stdout.splitlines() if "::test_exercise[" in line]


def test_k_with_an_exercise_handle_selects_that_exercise_alone(tmp_path):
    """Every exercise's handle (`pNN_name`, printed under its heading in the notebook) selects exactly that
    exercise under pytest's own `-k` matching (substrings of every name, keyword and parent of a test)."""
    import json

    (tmp_path / "handle_probe.py").write_text(HANDLE_PROBE)
    _collect(tmp_path, probe=True)
    selected = json.loads((tmp_path / "handles.json").read_text())
    expected = {e.handle(p.assignment_id): f"labs/test_labs.py::test_exercise[{p.assignment_id}::{e.name}]"
                for p in all_phases() for e in p.exercises}
    assert set(selected) == set(expected)
    wrong = {h: ids for h, ids in selected.items() if ids != [expected[h]]}
    assert not wrong, f"handles that do not select exactly their exercise: {wrong}"
    # the probe agrees with a real `-k` run
    for handle in ("p03_paged_attention", "p07_store_kv", "p06_check_stop"):
        assert _collect(tmp_path, "-k", handle) == [expected[handle]], handle


def test_k_selects_an_exercise_by_its_name_and_its_snake_case_name(tmp_path):
    """`pytest labs/ -k free_block_queue` (the check's snake_case name) and `-k FreeKVCacheBlockQueue` (the test
    id) also select phase 01's first lab: names that happen to be unique work too."""
    exercise = all_phases()[1].exercise("FreeKVCacheBlockQueue")
    assert {"free_block_queue", "free_kv_cache_block_queue", "test-free-block-queue"} <= set(exercise.keywords)
    for keyword in ("free_block_queue", "FreeKVCacheBlockQueue", "free_kv_cache_block_queue"):
        assert _collect(tmp_path, "-k", keyword) == [
            "labs/test_labs.py::test_exercise[01_paged_kv::FreeKVCacheBlockQueue]"], keyword
