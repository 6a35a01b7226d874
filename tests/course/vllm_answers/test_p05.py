"""Phase 05: vLLM v0.33.0's own scheduling decisions, adapted only in their call shape, pass the lab checks.

vLLM's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) is too coupled to run here as a whole: it
reads KV connectors, encoder caches, LoRA, pause states, async placeholders and a `VllmConfig`. The two
decisions phase 05 grades as functions are inline statements of it, not functions of their own, so the
test lifts exactly those statements out of vLLM's source (read at test time from `MINI_VLLM_SOURCE`, never
copied into the repo) and runs them inside a thin wrapper:

* `select_preemption_victim`: the `if self.policy == SchedulingPolicy.PRIORITY: preempted_req = max(...)
  else: preempted_req = self.running[-1]` of the running loop;
* `num_tokens_to_schedule`: the running loop's statements from `num_new_tokens = (...)` down to the length
  cap `max_model_len - num_computed_tokens - num_sampled_tokens_per_step`;
* the per-step `long_prefill_token_threshold` (0 for a lone request), compared with mini's
  `Scheduler.long_prefill_token_threshold_for_step`, which the `schedule` solution uses;
* speculative decoding: the assignment of what a running request wants (`request.num_tokens_with_spec + ...`) and
  the `if request.spec_token_ids:` block that picks the drafts a step verifies, run inside mini's `schedule` in
  place of its own two helpers: `check_schedule` passes, speculative workloads included. (vLLM's lookahead slots
  are not lifted: vLLM passes `num_lookahead_tokens` to every allocation, mini only to one that reaches the
  request's last known token; the notebook states mini's rule.)
"""

from __future__ import annotations

import ast
import textwrap
import types

import pytest

from labs.checks import p05
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request
from mini.core.sched.request_queue import SchedulingPolicy
from mini.core.sched.scheduler import Scheduler
from mini.sampling_params import SamplingParams
from tests.course.fidelity import vllm_source_root

SCHEDULER_PY = "vllm/v1/core/sched/scheduler.py"


def _schedule_source() -> tuple[str, ast.FunctionDef]:
    root = vllm_source_root()
    if root is None:
        pytest.skip("set MINI_VLLM_SOURCE to an unpacked vLLM v0.33.0 tree (the folder holding vllm/)")
    source = (root / SCHEDULER_PY).read_text(encoding="utf-8")
    scheduler = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    schedule = next(n for n in scheduler.body if isinstance(n, ast.FunctionDef) and n.name == "schedule")
    return source, schedule


def _segment(source: str, first: ast.stmt, last: ast.stmt) -> str:
    lines = source.splitlines()[first.lineno - 1:last.end_lineno]
    return textwrap.dedent("\n".join(lines))


def _as_function(header: str, prologue: list[str], body: str, result: str, namespace: dict) -> types.FunctionType:
    indented = textwrap.indent(body, "    ")
    code = "\n".join([header, *(f"    {line}" for line in prologue), indented, f"    return {result}", ""])
    exec(compile(code, f"<vLLM v0.33.0 {SCHEDULER_PY} (statements of Scheduler.schedule)>", "exec"), namespace)  # noqa: S102
    return namespace[header.split()[1].split("(")[0]]


def _running_loop(schedule: ast.FunctionDef) -> ast.While:
    return next(n for n in ast.walk(schedule) if isinstance(n, ast.While)
                and "self.running" in ast.unparse(n.test))


def vllm_select_preemption_victim() -> types.FunctionType:
    source, schedule = _schedule_source()
    choice = next(n for n in ast.walk(_running_loop(schedule)) if isinstance(n, ast.If)
                  and "preempted_req = max(" in ast.unparse(n) and "self.running[-1]" in ast.unparse(n.orelse[0]))
    return _as_function(
        "def select_preemption_victim(running, policy):",
        ["self = types.SimpleNamespace(policy=policy, running=running)"],
        _segment(source, choice, choice), "preempted_req",
        {"types": types, "SchedulingPolicy": SchedulingPolicy})


def vllm_num_tokens_to_schedule() -> types.FunctionType:
    source, schedule = _schedule_source()
    body = _running_loop(schedule).body
    first = next(i for i, n in enumerate(body) if isinstance(n, ast.Assign)
                 and ast.unparse(n.targets[0]) == "num_new_tokens")
    last = next(i for i, n in enumerate(body) if i > first and "num_sampled_tokens_per_step" in ast.unparse(n))
    return _as_function(
        "def num_tokens_to_schedule(num_tokens, num_computed_tokens, token_budget, long_prefill_token_threshold,"
        " max_model_len):",
        [("request = types.SimpleNamespace(num_tokens_with_spec=num_tokens, num_output_placeholders=0,"
         " num_computed_tokens=num_computed_tokens)"),
         "self = types.SimpleNamespace(max_model_len=max_model_len, num_sampled_tokens_per_step=1)",
         "input_budget, draft_slots = token_budget, 0"],
        _segment(source, body[first], body[last]), "num_new_tokens", {"types": types})


def vllm_threshold_for_step() -> types.FunctionType:
    source, schedule = _schedule_source()
    first = next(n for n in schedule.body if "self.get_request_counts()" in ast.unparse(n))
    last = next(n for n in schedule.body if isinstance(n, ast.If)
                and "adaptive_long_prefill_threshold" in ast.unparse(n.test))
    return _as_function(
        "def threshold_for_step(scheduler):",
        [("self = types.SimpleNamespace(get_request_counts=scheduler.get_request_counts,"
         " adaptive_long_prefill_threshold=False, scheduler_config=types.SimpleNamespace("
         "long_prefill_token_threshold=scheduler.long_prefill_token_threshold))"),
         "input_budget = scheduler.max_num_scheduled_tokens"],
        _segment(source, first, last), "long_prefill_token_threshold", {"types": types})


def test_vllm_victim_choice_passes_the_check():
    p05.check_select_preemption_victim(vllm_select_preemption_victim())
    p05.check_select_preemption_victim(vllm_select_preemption_victim(), seeds=range(100, 300))


def test_vllm_token_count_passes_the_check():
    p05.check_num_tokens_to_schedule(vllm_num_tokens_to_schedule())
    p05.check_num_tokens_to_schedule(vllm_num_tokens_to_schedule(), seeds=range(100, 300))


@pytest.mark.parametrize("num_requests", [0, 1, 2, 3])
@pytest.mark.parametrize("running", [False, True])
def test_vllm_threshold_for_step_is_minis(num_requests, running):
    scheduler = Scheduler(EngineConfig(long_prefill_token_threshold=8, max_num_batched_tokens=16),
                          KVCacheManager(16, 4, False))
    for index in range(num_requests):
        scheduler.add_request(Request(f"r{index}", [1, 2, 3], SamplingParams(max_tokens=2)))
    if running:
        scheduler.schedule()
    assert vllm_threshold_for_step()(scheduler) == scheduler.long_prefill_token_threshold_for_step()
    assert scheduler.long_prefill_token_threshold_for_step() == (8 if num_requests > 1 else 0)


def vllm_speculative_statements() -> tuple[types.FunctionType, types.FunctionType]:
    """vLLM's two speculative-decoding statements of the running loop, as functions of one request:

    * what a running request wants: the `num_new_tokens = (request.num_tokens_with_spec + ...)` assignment;
    * which drafts the step verifies: the `if request.spec_token_ids:` block after a request is scheduled (it
      trims them to the scheduled tokens past the known ones and clears the request's list).
    """
    source, schedule = _schedule_source()
    body = _running_loop(schedule).body
    wanted = next(n for n in body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "num_new_tokens"
                  and "num_tokens_with_spec" in ast.unparse(n.value))
    drafts = next(n for n in body if isinstance(n, ast.If) and ast.unparse(n.test) == "request.spec_token_ids")
    num_wanted = _as_function("def num_wanted(request):", [], _segment(source, wanted, wanted), "num_new_tokens", {})
    take_drafts = _as_function(
        "def take_drafts(request, num_new_tokens):", ["scheduled_spec_decode_tokens = {}"],
        _segment(source, drafts, drafts), "scheduled_spec_decode_tokens.get(request.request_id, [])", {})
    return num_wanted, take_drafts


def test_vllm_speculative_budgeting_passes_the_schedule_check():
    """mini's `schedule` with vLLM's own statements for what a running request wants (drafts included) and for the
    drafts a step verifies passes check_schedule on its speculative workloads (n-gram and a drafter with KV)."""
    num_wanted, take_drafts = vllm_speculative_statements()

    def schedule_with_vllm_drafts(self):
        self._num_running_tokens_wanted = num_wanted
        self._take_drafts_to_verify = take_drafts
        return Scheduler.schedule(self)

    p05.check_schedule(schedule_with_vllm_drafts)
    p05.check_schedule(schedule_with_vllm_drafts, seeds=range(100, 160))
