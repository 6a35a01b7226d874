"""Grader feedback when the learner's code RAISES (labs/checks/common.py `calling`): the call, the inputs,
what the reference returns for them and a hint, first line first (pytest -q's summary shows one line), no
helper frames and no chained traceback. And when it returns something WRONG: tables and tensors are never
dumped whole (`first_difference`: shape, dtype, the first differing entry with its coordinates and a window),
step-wise runs name the first step where they part (`expect_same_steps`), and "Plug it in" cells name the
first request and token that differ (`expect_same_outputs`), never a bare `assert`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from patience import RUN_GUARD_S

from labs.checks.common import (
    NotImplementedYet,
    calling,
    expect_same,
    expect_same_outputs,
    expect_same_steps,
    first_difference,
)
from labs.checks.p01 import check_get_new_blocks
from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT, write_release

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
    folder = tmp_path / "student" / assignment_id  # the release as generated (phases/ may hold a learner's work)
    shutil.copytree(write_release(tmp_path / "release", [assignment_id]) / assignment_id, folder)
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
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_GUARD_S, check=False,
    )
    output = result.stdout
    assert result.returncode == 1, output[-3000:]
    gist = ("01_paged_kv::get_new_blocks: `get_new_blocks` raised ValueError: not enough free blocks "
            "(the reference returns [3, 4, 5])")
    assert gist in output.splitlines(), output[-3000:]  # one line, not cut to the terminal's 80 columns
    assert "contextlib" not in output and "direct cause" not in output, output[-3000:]
    assert "labs/checks/common.py" not in output, output[-3000:]


# ---------------------------------------------------------------- wrong values: locate the first difference


def test_first_difference_names_the_entry_of_a_table_with_a_window():
    expected = [[-1, 1, -1, 2, -1], [-1, -1, 3, -1, -1], [-1] * 5]
    got = [[-1, 1, -1, 2, -1], [-1, -1, 4, -1, -1], [-1] * 5]
    found = first_difference(expected, got, axis_names=("dfa state", "byte class"))
    assert found.splitlines()[0] == "first difference at dfa state 1, byte class 2: expected 3, got 4", found
    assert "expected[1][0:5]: [-1, -1, 3, -1, -1]" in found and "got[1][0:5]:      [-1, -1, 4, -1, -1]" in found
    assert first_difference(expected, expected) is None
    assert first_difference(expected, expected[:2]) == "length: expected 3 entries, got 2 (the first 2 agree)"
    assert first_difference({"a": 1, "b": 2}, {"a": 1, "c": 2}).startswith("keys: missing ['b'], unexpected ['c']")
    assert first_difference({"q": [1, 2]}, {"q": [1, 5]}).startswith("first difference at ['q'][1]: expected 2, got 5")


def test_first_difference_of_tensors_checks_shape_then_dtype_then_the_entry():
    logits = torch.linspace(-1, 1, 3 * 64).reshape(3, 64)
    assert first_difference(logits, logits[:, :40]) == "shape: expected (3, 64), got (3, 40)"
    assert first_difference(logits, logits.double()) == "dtype: expected float32, got float64"
    assert first_difference(np.zeros(4, np.int32), np.zeros(4, np.int64)) == "dtype: expected int32, got int64"
    wrong = logits.clone()
    wrong[2, 50] = float("-inf")
    found = first_difference(logits, wrong, axis_names=("logits row", "token"))
    first, expected_row, got_row, caret = found.splitlines()
    assert first.startswith("first difference at logits row 2, token 50 (shape (3, 64), 1 of 192 entries differ)")
    assert expected_row.startswith("    expected[2][47:54]: ") and "-inf" in got_row
    assert caret.rstrip().endswith("^") and got_row[len(caret.rstrip()) - 4:len(caret.rstrip())].strip() == "-inf"
    assert len(found) < 600  # never the whole tensor
    masked = logits.clone()
    masked[0, :10] = float("-inf")
    assert first_difference(masked, masked.clone()) is None  # -inf equals -inf
    assert first_difference(logits, logits + 1e-7, atol=1e-6) is None


def test_expect_same_prints_the_location_and_not_a_wall_of_floats():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(0))
    got = logits.clone()
    got[3, 499] = 0.0
    with pytest.raises(AssertionError) as raised:
        expect_same("logits after the mask", {"rows": [3]}, logits, got, "mask only rows `indices`",
                    axis_names=("logits row", "token"))
    message = str(raised.value)
    assert "first difference at logits row 3, token 499" in message and "hint: mask only rows" in message
    assert len(message) < 1000, message


def test_expect_same_steps_names_the_first_step_where_the_runs_part():
    expected = [{"r0": [1]}, {"r0": [1], "r1": [2]}, {"r0": [1, 3], "r1": [2]}]
    got = [{"r0": [1]}, {"r0": [1], "r1": [2]}, {"r0": [1, 4], "r1": [2]}]
    with pytest.raises(AssertionError) as raised:
        expect_same_steps("block tables", expected, got, hint="look at allocate_slots",
                          context=["add r0", "add r1", "r0 grows: a new block"], step_names=[1, 2, 3])
    message = str(raised.value)
    assert message.splitlines()[0] == "block tables: your run and the reference part at step 3 (steps 1..2 agree)"
    assert "first difference at ['r0'][1]: expected 3, got 4" in message
    assert "one step before, both had: {'r0': [1], 'r1': [2]}" in message
    assert "what the reference did at this step: 'r0 grows: a new block'" in message
    expect_same_steps("block tables", expected, expected, hint="")


def test_expect_same_outputs_names_the_request_and_the_first_token():
    with pytest.raises(AssertionError) as raised:
        expect_same_outputs({"0": [5, 6, 7, 8], "1": [9, 9, 9]}, {"0": [5, 6, 7, 8], "1": [9, 4, 9]},
                            prompts=["a", {"prompt_token_ids": [1, 2]}])
    message = str(raised.value)
    assert "request 1 (id '1') differs from the reference" in message
    assert "prompt: {'prompt_token_ids': [1, 2]}" in message
    assert "first differing token: step 1" in message and "tokens 0..0 agree: [9]" in message
    assert "expected from step 1: [9, 9]" in message and "got from step 1:      [4, 9]" in message
    expect_same_outputs([[1, 2]], [[1, 2]])


WRONG_FREE_BLOCKS_TO_THE_TAIL = '''
def free_blocks(self, ordered_blocks):
    """Every freed block to the TAIL (vLLM before v0.33.0): the free queue order differs."""
    freed = []
    for block in ordered_blocks:
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            freed.append(block)
    self.free_block_queue.append_n(freed)
'''


def test_phase_01_plug_cell_names_the_step_and_what_the_reference_did():
    """Phase 01's "Plug it in" cell with a wrong free_blocks: it names the first step where the free queues part
    and the reference's scheduler events at that step (not a bare AssertionError)."""
    import nbformat

    from labs.course.answers import load_answers

    notebook = nbformat.read(REPO_ROOT / "solutions" / "01_paged_kv" / "01_paged_kv.ipynb", as_version=4)
    cells = {cell.id: cell.source for cell in notebook.cells}
    namespace = dict(load_answers(REPO_ROOT / "solutions" / "01_paged_kv" / "01_paged_kv.ipynb").namespace)
    exec(cells["widget"].split("for snapshot in")[0], namespace)  # noqa: S102 - the reference run, no widget
    exec(compile(WRONG_FREE_BLOCKS_TO_THE_TAIL, "<learner cell>", "exec"), namespace)  # noqa: S102
    with pytest.raises(AssertionError) as raised:
        exec(cells["plug"], namespace)  # noqa: S102
    message = str(raised.value)
    assert message.startswith("block tables and free queue: your run and the reference part at step "), message
    assert "first difference at ['free queue (head -> tail)'][" in message, message
    assert "what the reference did at this step: ['free " in message and "one step before, both had:" in message
    assert "hint: compare with what the reference did at that step" in message


WRONG_BITMASK_BITS_REVERSED = '''
def apply_token_bitmask_inplace(logits, bitmask, indices=None):
    """Reads each word's bits from the most significant end: the wrong tokens are allowed."""
    vocab_size = logits.shape[1]
    shifts = torch.arange(31, -1, -1, dtype=torch.int32)
    allowed = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < vocab_size:
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]), value=False)
    allowed = allowed[:, :vocab_size]
    rows = torch.arange(logits.shape[0]) if indices is None else indices.to(torch.int64)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits
'''


def test_phase_11_plug_cell_names_the_request_and_the_first_token():
    """Phase 11's "Plug it in" cell with a wrong bitmask application: the first request that differs, its prompt,
    the first generated token where the runs part and both texts and finish reasons (not a bare assert)."""
    import nbformat

    from labs.course.answers import load_answers

    path = REPO_ROOT / "solutions" / "11_structured_output" / "11_structured_output.ipynb"
    cells = {cell.id: cell.source for cell in nbformat.read(path, as_version=4).cells}
    namespace = dict(load_answers(path).namespace)
    exec(cells["demo-compile"], namespace)  # noqa: S102 - `pattern` and `schema`
    exec("from mini import LLM, SamplingParams\nfrom mini.sampling_params import StructuredOutputsParams",  # noqa: S102
         namespace)
    exec(compile(WRONG_BITMASK_BITS_REVERSED, "<learner cell>", "exec"), namespace)  # noqa: S102
    with pytest.raises(AssertionError) as raised:
        exec(cells["plug"], namespace)  # noqa: S102
    message = str(raised.value)
    assert message.startswith("the engine's outputs: request 0 (id '0') differs from the reference"), message
    assert "prompt: 'Code:'" in message and "first differing token: step " in message, message
    assert "expected: text " in message and "finish_reason" in message and "hint: the masks differ" in message
