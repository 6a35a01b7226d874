"""Grading that cannot be fooled or crashed (issue 38, labs/checks/grading.py and labs/course/answers.py).

* An exercise is graded on the object its own answer cell defines: a later cell that imports mini's reference
  under the same name replaces neither that object nor what its code sees; an answer cell that imports the
  reference, subclasses it without writing anything, or hands the work to it is reported as such.
* A graded check runs in a child process: a crash (segfault), a hang (CPU time spent, or none at all for too
  long) or a runaway allocation fails that exercise alone with a message naming it, and the grader goes on.
  The limits are CPU time and memory, never wall-clock time: the idle watch only fires on a process that uses
  no CPU at all.
"""

from __future__ import annotations

import ctypes
import shutil
import time

import nbformat
import pytest

from labs.checks.grading import Limits, graded, isolation_available, run_isolated
from labs.course import authoring as A
from labs.course.answers import AnswerCellError, NotImplementedYet, load_answers
from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT

pytestmark = pytest.mark.skipif(not isolation_available(), reason="isolation needs os.fork (POSIX)")

SMALL = Limits(cpu_limit_s=2.0, idle_limit_s=2.0, memory_limit_gib=0.25)


def _answer(source: str, grade_id: str):
    """An answer cell holding `source` as the learner left it (an empty solution block after it)."""
    return A.answer(f"{source}\n### BEGIN SOLUTION\n### END SOLUTION", grade_id)


def _write(tmp_path, cells):
    path = tmp_path / "nb.ipynb"
    nbformat.write(A.new_notebook(cells), str(path))
    return path


# ---- the answer a cell defines is the one graded ---------------------------------------------------------

def test_a_later_import_replaces_neither_the_answer_nor_what_its_code_sees(tmp_path):
    path = _write(tmp_path, [
        A.setup("import mini.core.kv_cache_utils as kv", "setup"),
        _answer("def hash_block_tokens(hash_function, parent, tokens, extra_keys=None):\n"
                 "    return 'broken'", "a-hash"),
        _answer("def hash_twice(*args):\n    return hash_block_tokens(*args) * 2", "a-twice"),
        _answer("from mini.core.kv_cache_utils import hash_block_tokens\n"
                 "def unrelated():\n    return 1", "a-later"),
    ])
    answers = load_answers(path)
    assert answers.get("hash_block_tokens")(None, None, []) == "broken"
    assert answers.get("hash_twice")(None, None, []) == "brokenbroken"  # its globals: as its cell left them
    assert answers.get("unrelated")() == 1


def test_an_answer_cell_that_only_imports_the_reference_is_reported(tmp_path):
    path = _write(tmp_path, [
        A.setup("import torch", "setup"),
        _answer("from mini.attention.reference import store_kv  # the reference, not an answer", "a-store"),
    ])
    with pytest.raises(AnswerCellError, match=r"binds `store_kv` to mini's own `mini\.attention\.reference\.store_kv`"):
        load_answers(path).get("store_kv")


@pytest.mark.parametrize(("source", "says"), [
    (("def store_kv(key, value, kv_cache, slot_mapping):\n"
     "    return attn.store_kv(key, value, kv_cache, slot_mapping)"), "calls mini's own `attn.store_kv`"),
    (("def store_kv(key, value, kv_cache, slot_mapping):\n"
     "    return reference('store_kv')(key, value, kv_cache, slot_mapping)"), "asks mini for the reference"),
    ("class BlockPool(ReferencePool):\n    pass", "subclasses mini's own"),
    (("class BlockPool(ReferencePool):\n    def get_new_blocks(self, n):\n"
     "        return super().get_new_blocks(n)"), "super().get_new_blocks"),
])
def test_an_answer_that_hands_its_work_to_the_reference_is_reported(tmp_path, source, says):
    name = "BlockPool" if "class" in source else "store_kv"
    path = _write(tmp_path, [
        A.setup("import mini.attention.reference as attn\nfrom mini.roles import reference\n"
                "from mini.core.block_pool import BlockPool as ReferencePool", "setup"),
        _answer(source, "a-answer"),
    ])
    with pytest.raises(AnswerCellError, match="does not implement") as failure:
        load_answers(path).get(name)
    assert says in str(failure.value)


def test_an_exercise_class_that_overrides_a_method_of_the_reference_is_its_own(tmp_path):
    path = _write(tmp_path, [
        A.setup("from mini.core.block_pool import BlockPool as ReferencePool", "setup"),
        _answer("class BlockPool(ReferencePool):\n    def get_num_free_blocks(self):\n        return 7", "a-pool"),
    ])
    assert load_answers(path).get("BlockPool").get_num_free_blocks(None) == 7


# ---- a graded check runs isolated --------------------------------------------------------------------------

@graded
def check_returns_one(candidate) -> None:
    print("check_returns_one: ran")
    assert candidate() == 1, f"expected 1, got {candidate()!r}"


def test_a_graded_check_returns_its_verdict_and_what_it_printed(capsys):
    check_returns_one(lambda: 1)
    assert "check_returns_one: ran" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="expected 1, got 2"):
        check_returns_one(lambda: 2)


def test_not_implemented_and_answer_cell_errors_keep_their_kind():
    def stub():
        raise NotImplementedYet("`f` is not implemented yet")

    with pytest.raises(NotImplementedYet, match="not implemented yet"):
        run_isolated(stub, what="`f`")

    def broken_cell():
        raise AnswerCellError("answer cell 'a' failed")

    with pytest.raises(AnswerCellError, match="answer cell 'a' failed"):
        run_isolated(broken_cell, what="`f`")


def test_a_segfault_fails_that_check_alone():
    with pytest.raises(AssertionError, match=r"`kernel` crashed \(SIGSEGV") as failure:
        run_isolated(lambda: ctypes.string_at(0), what="`kernel`", limits=SMALL)
    assert "outside a tensor" in str(failure.value)
    check_returns_one(lambda: 1)  # this process goes on grading


def test_a_crashing_child_writes_no_core_dump():
    """Dumping a process that holds torch (or piping it to a crash collector) takes seconds without CPU, which
    read as idle and hid the crash on a CI machine: the child's core limit is 1 byte, which stops both kinds."""
    import resource

    def core_limit_is_off():
        soft, _ = resource.getrlimit(resource.RLIMIT_CORE)
        assert soft <= 1, f"the child's RLIMIT_CORE is {soft}"

    run_isolated(core_limit_is_off, what="`core`", limits=SMALL)


def test_a_runnable_process_is_never_idle_and_a_sleeping_one_is_not_runnable():
    """The idle watch counts only a process asleep: one waiting for a core on a loaded machine has not moved
    its CPU time, yet it is making progress."""
    import subprocess
    import sys

    from labs.checks.grading import _usage

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(3600)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline().strip() == "asleep"
        time.sleep(0.2)
        assert _usage(spinner.pid)[2] is True
        assert _usage(sleeper.pid)[2] is False
    finally:
        spinner.kill()
        sleeper.kill()
        spinner.wait()
        sleeper.wait()


def test_an_endless_loop_fails_on_cpu_time():
    def spin():
        while True:
            pass

    with pytest.raises(AssertionError, match=r"`spin` ran for more than 2 s of CPU time"):
        run_isolated(spin, what="`spin`", limits=SMALL)


def test_a_check_that_waits_forever_fails_as_idle():
    with pytest.raises(AssertionError, match=r"`wait` stopped making progress: no CPU used for 2 s"):
        run_isolated(lambda: time.sleep(3600), what="`wait`", limits=SMALL)


def test_a_runaway_allocation_fails_on_memory():
    def grow():
        blocks = []
        for _ in range(150):  # at most 3 GiB, 20 MiB at a time
            blocks.append(bytearray(20 * 2**20))
            time.sleep(0.01)

    with pytest.raises(AssertionError, match=r"`grow` used more than 0.25 GiB of memory"):
        run_isolated(grow, what="`grow`", limits=SMALL)


def test_pytest_labs_grades_the_other_exercises_after_a_crash(tmp_path):
    """The whole `pytest labs/` path: one answer segfaults, the run still ends with a summary, that exercise
    fails naming the crash, and the phase's other exercises are graded as usual."""
    from tests.course.test_labs import run_labs  # the same subprocess harness as the other pytest-labs tests

    assignment_id = "02_slot_mapping"
    folder = tmp_path / "notebooks" / assignment_id
    folder.mkdir(parents=True)
    source = REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb"
    shutil.copy(source, folder / source.name)
    notebook = read_notebook(folder / source.name)
    for cell in notebook.cells:
        if cell.id == "answer-positions":
            cell.source = ("import ctypes\n\ndef compute_positions(num_computed_tokens, num_scheduled_tokens):\n"
                           "    return ctypes.string_at(0)\n")
    write_normalized(notebook, folder / source.name)
    outcomes = run_labs(tmp_path, "labs/", "-k", assignment_id, "--notebooks", str(tmp_path / "notebooks"))
    by_name = {name.split("::")[-1].rstrip("]"): value for name, value in outcomes.items()}
    outcome, message = by_name["compute_positions"]
    assert outcome == "failed" and "02_slot_mapping::compute_positions crashed (SIGSEGV" in message, message
    assert "answer cell answer-positions>\", line 4 in compute_positions" in message, message
    assert by_name["compute_query_start_loc"][0] == "passed"
    assert by_name["compute_slot_mapping"][0] == "passed"


def test_the_capstone_counts_an_imported_reference_as_not_the_learners(tmp_path):
    """labs.assemble reads the same per-cell answers: an import of mini's reference is "not yours", and a
    later cell's import does not turn a broken answer into the reference."""
    from labs.assemble import _why_not_learner

    path = _write(tmp_path, [
        A.setup("import torch", "setup"),
        _answer("from mini.attention.reference import store_kv", "a-store"),
        _answer("def gather_kv(kv_cache_side, block_ids, seq_len):\n    return 'mine'", "a-gather"),
        _answer("from mini.attention.reference import gather_kv", "a-later"),
    ])
    answers = load_answers(path)
    why, value = _why_not_learner("store_kv", answers, None)
    assert why.startswith("not yours: it binds `store_kv` to mini's own") and value is None
    why, value = _why_not_learner("gather_kv", answers, None)
    assert why is None and value(None, None, 0) == "mine"
