"""labs.assemble: the learner's whole engine, assembled from their phase notebooks.

The solutions assemble into an engine token-identical to the reference; the untouched release assembles into
all-reference parts (every exercise reported untouched) and still runs (the release as generated from
solutions/, not the checkout's phases/, where a learner may be working); a copy of the solutions with one wrong
answer names that component (its check fails on the report card, exactness breaks, and the bisection finds it);
answers that do not load, half-written classes, missing notebooks, Triton-less machines and broken phase tables
are rows of the report, never crashes. Notebooks are loaded once per path (labs.assemble caches them).
"""

from __future__ import annotations

import functools
import importlib
import shutil
from pathlib import Path

import pytest

from labs import assemble
from labs.assemble import (
    LEARNER,
    Component,
    EngineParts,
    course_notebooks_dir,
    find_breaking_component,
    first_divergence,
    phase_scores,
    stub_functions,
)
from labs.course.notebook_format import read_notebook, write_normalized
from labs.course.release import REPO_ROOT, write_release
from labs.manifest import all_phases
from mini import LLM, SamplingParams

assembly = importlib.import_module("labs.assemble")  # the module (the attribute `labs.assemble` is the function)
ENGINE_PHASES = [p for p in all_phases() if not p.assignment_id.endswith("_capstone")]
NUM_COMPONENTS = sum(len(p.exercises) for p in ENGINE_PHASES)
PROMPTS = [{"prompt_token_ids": ids} for ids in ([1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13])]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def small_engine() -> LLM:
    # A fixed small pool (no start-up profiling) and token-id prompts: quick to build, many times over.
    return LLM(skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=64, max_model_len=64)


def tokens(llm: LLM) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@functools.cache
def reference_tokens() -> list[list[int]]:
    return tokens(small_engine())


@functools.cache
def solutions() -> EngineParts:
    return assemble(REPO_ROOT / "solutions")


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory) -> Path:
    """The release as generated from solutions/: never the checkout's phases/, where a learner may be working."""
    return write_release(tmp_path_factory.mktemp("release"))


def test_the_solutions_assemble_into_an_engine_identical_to_the_reference():
    parts = solutions()
    assert len(parts.report) == NUM_COMPONENTS
    pluggable = [c for c in parts.report if c.part is not None]
    assert parts.learner == pluggable, [c for c in pluggable if not c.is_learner]
    assert all(c.status == "not pluggable" and c.implementation is not None for c in parts.not_pluggable)
    assert parts.missing == []
    with parts:
        got = tokens(small_engine())
    assert got == reference_tokens()


def test_the_untouched_release_is_all_reference_and_runs_like_the_reference(release_dir):
    parts = assemble(release_dir)
    assert len(parts.report) == NUM_COMPONENTS
    assert parts.learner == [] and parts.replacements == {}
    for component in parts.report:
        assert component.status in ("reference (untouched)", "not pluggable (untouched)"), component
    with parts:
        assert tokens(small_engine()) == reference_tokens()
    card = parts.check(only=["compute_slot_mapping", "merge_delta_outputs"])
    assert [r.outcome for r in card] == ["not implemented", "not implemented"]


def _copy_of_solutions(tmp_path: Path, edits: dict[tuple[str, str], str]) -> Path:
    """solutions/ copied to tmp_path (notebooks only), with the answer cells {(phase, grade_id): source} replaced."""
    folder = tmp_path / "course"
    for phase in ENGINE_PHASES:
        source = REPO_ROOT / "solutions" / phase.assignment_id / f"{phase.assignment_id}.ipynb"
        target = folder / phase.assignment_id / source.name
        target.parent.mkdir(parents=True)
        if not any(assignment == phase.assignment_id for assignment, _ in edits):
            shutil.copy(source, target)
            continue
        notebook = read_notebook(source)
        for cell in notebook.cells:
            key = (phase.assignment_id, cell.metadata.get("nbgrader", {}).get("grade_id"))
            if key in edits:
                cell.source = edits[key]
        write_normalized(notebook, target)
    return folder


FORGETFUL_RMS_NORM = '''
def rms_norm(x, weight, eps):
    """Normalizes correctly, then forgets the learned weight."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
'''


def test_one_wrong_answer_is_named_by_its_check_by_exactness_and_by_the_bisection(tmp_path):
    folder = _copy_of_solutions(tmp_path, {("04_model_runner", "answer-rms-norm"): FORGETFUL_RMS_NORM})
    parts = assemble(folder)
    assert parts.component("rms_norm").status == LEARNER
    card = parts.check(only=["rms_norm", "apply_rotary"], time_reference=False)
    assert [(r.exercise, r.outcome) for r in card] == [("rms_norm", "failed"), ("apply_rotary", "passed")]
    assert "rms_norm" in card[0].message

    with parts:
        got = tokens(small_engine())
    assert first_divergence(reference_tokens(), got) is not None

    def is_exact(subset: list[str]) -> bool:
        with parts.plugged(subset):
            return tokens(small_engine()) == reference_tokens()

    suspects = [c.part for c in parts.learner]
    assert find_breaking_component(suspects, is_exact) == "rms_norm"


def test_answers_that_do_not_load_or_are_half_written_are_reported_not_fatal(tmp_path):
    edits = {
        ("02_slot_mapping", "answer-positions"):
            "def compute_positions(num_computed_tokens, num_scheduled_tokens)\n    return 1\n",
        ("02_slot_mapping", "answer-slot-mapping"):
            "def compute_slot_mapping(block_table, req_indices, positions, block_size):\n"
            "    return undefined_name\n\nraise RuntimeError('boom at definition')\n",
        ("01_paged_kv", "answer-free-block-queue"):
            "class FreeKVCacheBlockQueue:\n"
            "    def __init__(self, blocks):\n        self.blocks = list(blocks)\n"
            "    def popleft(self):\n        # YOUR CODE HERE\n        raise NotImplementedError()\n",
    }
    folder = _copy_of_solutions(tmp_path, edits)
    (folder / "13_serving" / "13_serving.ipynb").unlink()
    parts = assemble(folder)
    status = {c.exercise: c.status for c in parts.report}
    assert status["compute_positions"].startswith("reference (failed to load: SyntaxError"), status
    assert status["compute_slot_mapping"].startswith("reference (failed to load: RuntimeError: boom"), status
    assert status["FreeKVCacheBlockQueue"] == "reference (unfinished: NotImplementedError in popleft)"
    assert status["merge_delta_outputs"].startswith("not pluggable (no notebook: ")
    assert status["compute_query_start_loc"] == LEARNER  # the rest of the phase is still yours
    card = parts.check(only=["compute_positions", "FreeKVCacheBlockQueue"], time_reference=False)
    assert {r.exercise: r.outcome for r in card} == {"compute_positions": "failed",
                                                      "FreeKVCacheBlockQueue": "not implemented"}
    with parts:
        assert tokens(small_engine()) == reference_tokens()


def test_kernel_exercises_are_reference_where_triton_cannot_run(monkeypatch):
    monkeypatch.setattr(assembly, "_triton_unusable_reason", lambda: "no triton here")
    parts = assembly.assemble(REPO_ROOT / "solutions")
    kernels = [c for c in parts.report if c.needs_triton]
    assert kernels and all(c.status == "reference (needs Triton: no triton here)" for c in kernels)
    assert not any(c.part in parts.replacements for c in kernels)
    card = parts.check(only=[c.part for c in kernels], time_reference=False)
    assert {r.outcome for r in card} == {"skipped"}


def test_a_broken_phase_table_is_a_row_of_the_report(monkeypatch, release_dir):
    real = assembly._phase_tables

    def with_a_broken_one():
        phases, broken = real()
        return phases, [*broken, ("p99", "SyntaxError: a phase being written")]

    monkeypatch.setattr(assembly, "_phase_tables", with_a_broken_one)
    parts = assembly.assemble(release_dir)
    assert parts.report[-1] == Component("p99", "*", None,
                                         "reference (phase table failed to load: SyntaxError: a phase being written)")


def test_solutions_and_release_loaded_in_one_process_keep_their_own_kernels(release_dir):
    """Each notebook's cells get their own pseudo file names: a Triton kernel reads its source back from them."""
    from labs.checks import p07

    if not p07.TRITON_AVAILABLE:
        pytest.skip(p07.kernel_labs_message())
    parts = solutions()
    assemble(release_dir)  # loads the release's stub kernels under the same names
    card = parts.check(only=["_store_kv_kernel"], time_reference=False)
    assert [r.outcome for r in card] == ["passed"], card


def test_the_notebooks_folder_is_found_from_where_the_notebook_runs(tmp_path, monkeypatch):
    for side in ("phases", "solutions"):
        for assignment in ("01_paged_kv", "17_capstone"):
            (tmp_path / side / assignment).mkdir(parents=True)
            (tmp_path / side / assignment / f"{assignment}.ipynb").write_text("{}")
    assert course_notebooks_dir(tmp_path / "phases" / "17_capstone") == tmp_path / "phases"
    assert course_notebooks_dir(tmp_path / "solutions" / "17_capstone") == tmp_path / "solutions"
    assert course_notebooks_dir(tmp_path) == tmp_path / "phases"
    (tmp_path / "tests").mkdir()
    assert course_notebooks_dir(tmp_path / "tests") == tmp_path / "phases"
    monkeypatch.chdir(tmp_path / "phases" / "17_capstone")  # a relative name is looked up above the notebook
    assert assembly._resolve_notebooks_dir("solutions") == tmp_path / "solutions"
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        assembly._resolve_notebooks_dir("no_such_folder")


def test_stubs_are_told_from_answers():
    stub = "def f(x):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    assert stub_functions(stub, "f") == (["f"], 1)
    assert stub_functions("def f(x):\n    if x:\n        raise NotImplementedError\n    return 1\n", "f") == ([], 1)
    assert stub_functions("def f(x):\n    return 1\n    raise NotImplementedError()\n", "f") == ([], 1)
    cls = "class C:\n    def a(self):\n        raise NotImplementedError()\n    def b(self):\n        return 2\n"
    assert stub_functions(cls, "C") == (["a"], 2)
    assert stub_functions("def f(:\n", "f") == ([], 0)


def test_the_reference_helpers_pass_the_capstone_checks():
    from labs.checks import p17

    p17.check_first_divergence(first_divergence)
    p17.check_find_breaking_component(find_breaking_component)
    p17.check_phase_scores(phase_scores)
