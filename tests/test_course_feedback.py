"""Grader feedback when the learner's code RAISES (labs/checks/common.py `calling`): the call, the inputs,
what the reference returns for them and a hint, first line first (pytest -q's summary shows one line), no
helper frames and no chained traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from labs.checks.common import NotImplementedYet, calling
from labs.checks.p01 import check_get_new_blocks
from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT

RAISING_GET_NEW_BLOCKS = '''def get_new_blocks(self, num_blocks):
    """BlockPool.get_new_blocks: `num_blocks` blocks from the head of the free queue, each with ref_cnt 1."""
    if num_blocks > 2:  # wrong: 5 blocks are free at the second call
        raise ValueError("not enough free blocks")
    blocks = [self.free_block_queue.popleft() for _ in range(num_blocks)]
    for block in blocks:
        block.ref_cnt = 1
    return blocks
'''


def _raising_get_new_blocks():
    namespace: dict = {}
    exec(compile(RAISING_GET_NEW_BLOCKS, "<learner cell>", "exec"), namespace)  # noqa: S102
    return namespace["get_new_blocks"]


def test_a_raising_answer_gets_call_inputs_expected_value_and_hint():
    with pytest.raises(AssertionError) as raised:
        check_get_new_blocks(_raising_get_new_blocks())
    message = str(raised.value)
    first_line, *rest = message.splitlines()
    assert first_line == ("`get_new_blocks` raised ValueError: not enough free blocks "
                          "(the reference returns [3, 4, 5])"), message
    body = "\n".join(rest)
    assert "raised at: <learner cell>, line 4" in body
    assert "num_gpu_blocks = 6" in body and "'get_new_blocks(3)'" in body
    assert "expected (the reference, same inputs): [3, 4, 5]" in body
    assert "hint: " in body
    # no chained traceback ("The above exception was the direct cause ..."), no helper frame shown
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    shown = [entry for entry in raised.traceback if not entry.ishidden(raised)]
    assert all("contextlib" not in str(entry.path) and entry.path.name != "common.py" for entry in shown), shown


def test_not_implemented_stays_not_implemented_and_assertions_pass_through():
    def stub(*_args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedYet, match="not implemented yet") as raised, calling("f", {"x": 1}):
        stub()
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    with pytest.raises(AssertionError, match="^mine$"), calling("f", {"x": 1}, expected=2):
        raise AssertionError("mine")
    with calling("f", {"x": 1}, expected=2):  # nothing raised: nothing happens
        pass


def test_pytest_q_shows_the_gist_uncut_and_no_helper_frames(tmp_path):
    assignment_id = "01_paged_kv"
    folder = tmp_path / "student" / assignment_id
    shutil.copytree(REPO_ROOT / "phases" / assignment_id, folder)
    path = folder / f"{assignment_id}.ipynb"
    notebook = read_notebook(path)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "answer-get-new-blocks":
            cell.source = RAISING_GET_NEW_BLOCKS
    write_normalized(notebook, path)
    env = {**os.environ, "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CI", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "labs/", "-q", "-p", "no:cacheprovider", "-k", "get_new_blocks",
         "--notebooks", str(tmp_path / "student")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    output = result.stdout
    assert result.returncode == 1, output[-3000:]
    gist = ("01_paged_kv::get_new_blocks: `get_new_blocks` raised ValueError: not enough free blocks "
            "(the reference returns [3, 4, 5])")
    assert gist in output.splitlines(), output[-3000:]  # one line, not cut to the terminal's 80 columns
    assert "contextlib" not in output and "direct cause" not in output, output[-3000:]
    assert "labs/checks/common.py" not in output, output[-3000:]
