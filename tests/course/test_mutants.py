"""The lab checks catch boundary mistakes: each seeded mutant of a solution (one comparison or condition
changed) fails its check with its DEFAULT seeds (what `pytest labs/` runs), and the unmutated solution
passes. A mutant is the solution cell's source (solutions/, read with labs.course.answers) with one edit,
run in the same namespace the grader builds."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from labs.checks import p05, p06, p08, p09
from labs.course.answers import NotebookAnswers, load_answers
from labs.course.release import REPO_ROOT


@functools.cache
def _solutions(assignment_id: str) -> NotebookAnswers:
    return load_answers(REPO_ROOT / "solutions" / assignment_id / f"{assignment_id}.ipynb")


def _mutant(assignment_id: str, name: str, original: str, mutated: str) -> Any:
    answers = _solutions(assignment_id)
    source = answers.cell_defining(name).source
    assert source.count(original) == 1, f"the solution of {name} no longer contains {original!r}"
    namespace = dict(answers.namespace)
    exec(compile(source.replace(original, mutated), f"<mutant of {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


MUTANTS = [
    pytest.param("06_engine_loop", "check_stop", p06.check_check_stop,
                 "if request.num_tokens >= max_model_len or (",
                 "if request.num_tokens > max_model_len or (", id="check_stop-max_model_len->"),
    pytest.param("06_engine_loop", "check_stop_strings", p06.check_check_stop_strings,
                 "index + len(stop_str) < best[0]", "index + len(stop_str) <= best[0]",
                 id="check_stop_strings-tie-goes-to-the-later"),
    pytest.param("09_logits_processors", "MinTokensLogitsProcessor", p09.check_min_tokens_processor,
                 "if len(output_ids) >= m]", "if len(output_ids) > m]", id="min_tokens_processor->"),
    pytest.param("08_sampler", "apply_top_k_top_p", p08.check_apply_top_k_top_p,
                 "torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)",
                 "torch.where(k >= vocab_size, vocab_size, k.clamp(min=1))", id="top_k-0-keeps-one-token"),
    pytest.param("08_sampler", "apply_top_k_top_p", p08.check_apply_top_k_top_p,
                 "(k <= 0) | (k >= vocab_size)", "(k < 0) | (k >= vocab_size)", id="top_k-0-is-a-k"),
    pytest.param("08_sampler", "gather_logprobs", p08.check_gather_logprobs,
                 "    if num_logprobs == -1:\n",
                 "    if num_logprobs == 0:\n        return None\n    if num_logprobs == -1:\n",
                 id="logprobs-0-is-none"),
    pytest.param("05_scheduler", "schedule", p05.check_schedule,
                 "if not self.enable_chunked_prefill and request.num_tokens - num_hit_tokens > token_budget:",
                 "if False:", id="schedule-ignores-enable_chunked_prefill"),
]


@pytest.mark.parametrize(("assignment_id", "name", "check", "original", "mutated"), MUTANTS)
def test_each_mutant_fails_its_check_and_the_solution_passes(assignment_id, name, check, original, mutated):
    check(_solutions(assignment_id).get(name))
    with pytest.raises(AssertionError):
        check(_mutant(assignment_id, name, original, mutated))
