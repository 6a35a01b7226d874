"""Phase 05 (the scheduler): plausible wrong answers to each exercise fail their check, with feedback that
locates the bug (for `schedule`: the first step where the learner's run and the reference part).

The rules graded are vLLM v0.33.0's (vllm/v1/core/sched/scheduler.py::Scheduler.schedule): the length cap
keeps a position for the sampled token, the priority victim is the first worst request of `running`, a lone
request gets no `long_prefill_token_threshold` cap, and a request that preempts itself under the priority
policy lets the running pass go on. Undoing a victim scheduled earlier in the same step must also take the
blocks it got out of the prefix cache (mini's own rule: vLLM frees them with their hashes).
"""

from __future__ import annotations

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

LENGTH_CAP = "max_model_len - num_computed_tokens - 1"
THRESHOLD_RULE = "threshold = self.long_prefill_token_threshold if num_running + num_waiting > 1 else 0"
PRIORITY_MAX = "max(running, key=lambda request: (request.priority, request.arrival_time))"
FIRST_PART = "(the first where your run and the reference part)"

WRONG = [
    # ---- num_tokens_to_schedule
    Wrong("num_tokens_to_schedule", "length cap off by one (no position kept for the sampled token)",
          edit=(LENGTH_CAP, "max_model_len - num_computed_tokens"), expect="needs a position below max_model_len"),
    Wrong("num_tokens_to_schedule", "length cap two short", edit=(LENGTH_CAP, "max_model_len - num_computed_tokens - 2"),
          expect="max_model_len"),
    Wrong("num_tokens_to_schedule", "threshold 0 read as a cap of 0",
          edit=("if 0 < long_prefill_token_threshold < num_new_tokens:",
                "if long_prefill_token_threshold < num_new_tokens:"),
          expect="long_prefill_token_threshold (when > 0)"),
    Wrong("num_tokens_to_schedule", "length cap measured from num_tokens",
          edit=(LENGTH_CAP, "max_model_len - num_tokens - 1"), expect="max_model_len"),
    Wrong("num_tokens_to_schedule", "budget ignored",
          edit=("num_new_tokens = min(num_new_tokens, token_budget)", "pass"), expect="token_budget"),
    # ---- select_preemption_victim
    Wrong("select_preemption_victim", "tie broken toward the later request",
          edit=(PRIORITY_MAX, "max(reversed(running), key=lambda r: (r.priority, r.arrival_time))"),
          expect="the FIRST such request in running"),
    Wrong("select_preemption_victim", "priority only, arrival ignored",
          edit=(PRIORITY_MAX, "max(running, key=lambda request: request.priority)"), expect="(priority, arrival_time)"),
    Wrong("select_preemption_victim", "smallest value taken as the least important",
          edit=(PRIORITY_MAX, "min(running, key=lambda request: (request.priority, request.arrival_time))"),
          expect="the largest"),
    Wrong("select_preemption_victim", "FCFS victim is the head of running",
          edit=("return running[-1]", "return running[0]"), expect="END of running"),
    Wrong("select_preemption_victim", "FCFS victim popped off running",
          edit=("return running[-1]", "return running.pop()"), expect="the running list after the call"),
    # ---- schedule
    Wrong("schedule", "undoes a scheduled victim without uncache_uncomputed_blocks",
          edit=("                manager.uncache_uncomputed_blocks(victim)\n", ""),
          expect=f"step 2 {FIRST_PART}: after update_from_output, scheduler prefix-cached block ids"),
    Wrong("schedule", "threshold applied to a lone request",
          edit=(THRESHOLD_RULE, "threshold = self.long_prefill_token_threshold"),
          expect=f"step 0 {FIRST_PART}: SchedulerOutput.num_scheduled_tokens"),
    Wrong("schedule", "threshold never applied",
          edit=(THRESHOLD_RULE, "threshold = 0"), expect=f"step 0 {FIRST_PART}"),
    Wrong("schedule", "priority self-preemption ends the running pass",
          edit=("                continue  # the more important ones after it may fit;",
                "                break  # the more important ones after it may fit;"),
          expect=f"step 2 {FIRST_PART}: SchedulerOutput.num_scheduled_tokens"),
    Wrong("schedule", "scheduled victim's tokens not given back to the budget",
          edit=("token_budget += num_scheduled_tokens.pop(victim.request_id)",
                "num_scheduled_tokens.pop(victim.request_id)"),
          expect=FIRST_PART),
    Wrong("schedule", "scheduled victim left in the step",
          edit=("            if victim in scheduled_running:  # (priority policy) undo its place in this step first",
                "            if False:"),
          expect=FIRST_PART),
    Wrong("schedule", "waiting requests admitted in a step with a preemption",
          edit=("while (not preempted and self.waiting", "while (self.waiting"), expect=FIRST_PART),
    Wrong("schedule", "waiting request ignores its prefix-cache hits",
          edit=("hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)",
                "hit_blocks, num_hit_tokens = [], 0"),
          expect=FIRST_PART),
    Wrong("schedule", "num_computed_tokens not advanced after scheduling",
          edit=("        self.requests[request_id].num_computed_tokens += num_tokens\n",
                "        pass\n"),
          expect=f"step 0 {FIRST_PART}"),
    Wrong("schedule", "prompt length instead of num_tokens for a resumed request",
          edit=("            request.num_tokens, num_hit_tokens, token_budget, threshold, self.max_request_len)",
                ("            request.num_prompt_tokens, num_hit_tokens, token_budget, threshold,"
                " self.max_request_len)")),
          expect=FIRST_PART),
    Wrong("schedule", "prefix-cache lookup never counted",
          edit=("        manager.record_prefix_cache_stats(request, num_hit_tokens)  # one lookup per admission\n", ""),
          expect="scheduler prefix-cache stats"),
    Wrong("schedule", "prefix-cache lookup counted every step the request waits",
          edit=("        hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)\n",
                ("        hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)\n"
                "        manager.record_prefix_cache_stats(request, num_hit_tokens)\n")),
          expect="scheduler prefix-cache stats"),
    Wrong("schedule", "enable_chunked_prefill ignored",
          edit=("if not self.enable_chunked_prefill and request.num_tokens - num_hit_tokens > token_budget:",
                "if False:"),
          expect=FIRST_PART),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("05_scheduler", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
