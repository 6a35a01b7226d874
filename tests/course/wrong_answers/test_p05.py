"""Phase 05 (the scheduler): plausible wrong answers to each exercise fail their check, with feedback that
locates the bug (for `schedule`: the first step where the learner's run and the reference part).

The rules graded are vLLM v0.33.0's (vllm/v1/core/sched/scheduler.py::Scheduler.schedule): the length cap
keeps a position for the sampled token, the priority victim is the first worst request of `running`, a lone
request gets no `long_prefill_token_threshold` cap, and a request that preempts itself under the priority
policy lets the running pass go on. Undoing a victim scheduled earlier in the same step must also take the
blocks it got out of the prefix cache (mini's own rule: vLLM frees them with their hashes). With speculative
decoding, `schedule` budgets a running request's drafts as vLLM does (they count in what it wants, the ones the step
computes go out in `scheduled_spec_decode_tokens`, the rest are dropped) and reserves lookahead slots for a drafter
with its own KV cache (mini's rule: only in an allocation that reaches the request's last known token).

Not among them: `num_tokens_to_schedule` without its final clamp at 0. The count only goes negative when
`num_computed_tokens >= max_model_len` (or past `num_tokens`), which neither engine ever reaches (a request stops at
`max_model_len`); vLLM's own statements (tests/course/vllm_answers/test_p05.py) have no clamp either, so a check
that failed the clamp-less answer would fail vLLM's code.
"""

from __future__ import annotations

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

LENGTH_CAP = "max_model_len - num_computed_tokens - 1"
THRESHOLD_RULE = "threshold = self.long_prefill_token_threshold if num_running + num_waiting > 1 else 0"
PRIORITY_MAX = "max(running, key=lambda request: (request.priority, request.arrival_time))"
FIRST_PART = "(the first where your run and the reference part)"

SPEC_WANTED = "request.num_tokens_with_spec, request.num_computed_tokens"
LOOKAHEAD_GUARD = "        if num_tokens_after_step < request.num_tokens:\n            return 0\n"
LOOKAHEAD_CAP = "return max(0, min(self.num_lookahead_tokens, self.max_request_len - num_tokens_after_step))"


def schedule_without_speculation() -> str:
    """The phase's `schedule` as it was before it handled drafts: what a learner writes who ignores them."""
    from tests.course.fidelity import solutions

    source = solutions("05_scheduler").cell_defining("schedule").source
    source = source.replace(SPEC_WANTED, "request.num_tokens, request.num_computed_tokens")
    source = source.replace("    output.scheduled_spec_decode_tokens = scheduled_spec_decode_tokens\n", "")
    return source.replace(LOOKAHEAD_GUARD + "        return max(0, min(", "        return 0 * max(0, min(")


WRONG = [
    # ---- num_tokens_to_schedule
    Wrong("num_tokens_to_schedule", "length cap off by one (no position kept for the sampled token)",
          edit=(LENGTH_CAP, "max_model_len - num_computed_tokens"), expect="needs a position below max_model_len"),
    Wrong("num_tokens_to_schedule", "length cap two short",
          edit=(LENGTH_CAP, "max_model_len - num_computed_tokens - 2"),
          expect="max_model_len"),
    Wrong("num_tokens_to_schedule", "threshold 0 read as a cap of 0",
          edit=("if 0 < long_prefill_token_threshold < num_new_tokens:",
                "if long_prefill_token_threshold < num_new_tokens:"),
          expect="long_prefill_token_threshold (when > 0)"),
    Wrong("num_tokens_to_schedule", "length cap measured from num_tokens",
          edit=(LENGTH_CAP, "max_model_len - num_tokens - 1"), expect="max_model_len"),
    Wrong("num_tokens_to_schedule", "budget ignored",
          edit=("num_new_tokens = min(num_new_tokens, token_budget)", "pass"), expect="token_budget"),
    Wrong("num_tokens_to_schedule", "max_model_len ignored",
          edit=(LENGTH_CAP, "num_new_tokens"), expect="needs a position below max_model_len"),
    Wrong("num_tokens_to_schedule", "the sampled token's position kept only for a decode",
          edit=(LENGTH_CAP, "max_model_len - num_computed_tokens - (num_tokens - num_computed_tokens == 1)"),
          expect="the token this step samples also needs a position below max_model_len"),
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
    Wrong("select_preemption_victim", "FCFS victim is the latest arrival, not the request admitted last",
          edit=("return running[-1]", "return max(running, key=lambda request: request.arrival_time)"),
          expect="the request at the END of running (admitted last)"),
    Wrong("select_preemption_victim", "policy compared with a string (PRIORITY never recognised)",
          edit=("if policy is SchedulingPolicy.PRIORITY:", 'if policy == "priority":'),
          expect="PRIORITY: the largest (priority, arrival_time)"),
    Wrong("select_preemption_victim", "returns the victim's index",
          edit=("return running[-1]", "return len(running) - 1"), expect="Return the Request itself"),
    # ---- schedule: each wrong answer fails at the first step where the runs part, with the RULE that step
    # exercises (labs/checks/p05.py::rule_hint), not a generic recipe
    Wrong("schedule", "undoes a scheduled victim without uncache_uncomputed_blocks",
          edit=("                manager.uncache_uncomputed_blocks(victim)\n", ""),
          expect=f"step 2 {FIRST_PART}: after update_from_output, scheduler prefix-cached block ids"),
    Wrong("schedule", "threshold applied to a lone request",
          edit=(THRESHOLD_RULE, "threshold = self.long_prefill_token_threshold"),
          expect="RULE: a lone request has nobody to starve"),
    Wrong("schedule", "threshold never applied",
          edit=(THRESHOLD_RULE, "threshold = 0"),
          expect="RULE: long_prefill_token_threshold caps every request's tokens"),
    Wrong("schedule", "priority self-preemption ends the running pass",
          edit=("                continue  # the more important ones after it may fit;",
                "                break  # the more important ones after it may fit;"),
          expect="RULE: a request that preempts itself"),
    Wrong("schedule", "scheduled victim's tokens not given back to the budget",
          edit=("token_budget += num_scheduled_tokens.pop(victim.request_id)",
                "num_scheduled_tokens.pop(victim.request_id)"),
          expect="its tokens go back to the token budget"),
    Wrong("schedule", "scheduled victim left in the step",
          edit=("            if victim in scheduled_running:  # (priority policy) undo its place in this step first",
                "            if False:"),
          expect="RULE: a victim already scheduled in this step (PRIORITY) is undone"),
    Wrong("schedule", "waiting requests admitted in a step with a preemption",
          edit=("while (not preempted and self.waiting", "while (self.waiting"),
          expect="RULE: no admission after a preemption"),
    Wrong("schedule", "waiting request ignores its prefix-cache hits",
          edit=("hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)",
                "hit_blocks, num_hit_tokens = [], 0"),
          expect="RULE: a waiting request starts after its prefix-cache hits"),
    Wrong("schedule", "num_computed_tokens not advanced after scheduling",
          edit=("        self.requests[request_id].num_computed_tokens += num_tokens\n",
                "        pass\n"),
          expect="RULE: after building the output, advance each scheduled request's num_computed_tokens"),
    Wrong("schedule", "prompt length instead of num_tokens for a resumed request",
          edit=("            request.num_tokens, num_hit_tokens, token_budget, threshold, self.max_request_len)",
                ("            request.num_prompt_tokens, num_hit_tokens, token_budget, threshold,"
                " self.max_request_len)")),
          expect="num_tokens counts the prompt AND its outputs"),
    Wrong("schedule", "prefix-cache lookup never counted",
          edit=("        manager.record_prefix_cache_stats(request, num_hit_tokens)  # one lookup per admission\n", ""),
          expect="scheduler prefix-cache stats"),
    Wrong("schedule", "prefix-cache lookup counted every step the request waits",
          edit=("        hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)\n",
                ("        hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)\n"
                "        manager.record_prefix_cache_stats(request, num_hit_tokens)\n")),
          expect="count a request's prefix-cache lookup once, when it is admitted"),
    Wrong("schedule", "enable_chunked_prefill ignored",
          edit=("if not self.enable_chunked_prefill and request.num_tokens - num_hit_tokens > token_budget:",
                "if False:"),
          expect="RULE: without chunked prefill a waiting prompt"),
    Wrong("schedule", "victim is always the head of running",
          edit=("victim = self.select_preemption_victim(self.running, self.policy)", "victim = self.running[0]"),
          expect="RULE: the victim is self.select_preemption_victim"),
    Wrong("schedule", "max_num_seqs ignored when admitting",
          edit=("           and len(self.running) < self.max_num_running_reqs):", "           ):"),
          expect="len(self.running) < max_num_seqs"),
    Wrong("schedule", "finished_req_ids never reset",
          edit=("    self.finished_req_ids = set()\n", ""), expect="start a new, empty set in self.finished_req_ids"),
    Wrong("schedule", "an admitted request's status not set to RUNNING",
          edit=("        request.status = RequestStatus.RUNNING\n", ""), expect="is RUNNING from this step on"),
    Wrong("schedule", "num_cached_tokens overwritten when a preempted request comes back",
          edit=("        if request.num_cached_tokens < 0:\n            request.num_cached_tokens = num_hit_tokens\n",
                "        request.num_cached_tokens = num_hit_tokens\n"),
          expect="set once, while it is still -1"),
    # ---- schedule with speculative decoding (issue 38, item 7)
    Wrong("schedule", "ignores the drafts (speculation silently off)", source=schedule_without_speculation(),
          expect="RULE: speculative decoding: a running request also wants its drafts computed"),
    Wrong("schedule", "counts the drafts but never tells the runner which tokens are drafts",
          edit=("    output.scheduled_spec_decode_tokens = scheduled_spec_decode_tokens\n", ""),
          expect="SchedulerOutput.scheduled_spec_decode_tokens names, per running request, the drafts"),
    Wrong("schedule", "the drafts the budget cut off are still sent for verification",
          edit=("request.spec_token_ids[:num_drafts]", "list(request.spec_token_ids)"),
          expect="only the first ones that fit when the budget or the length cap cut it short"),
    Wrong("schedule", "drafts ignored in what a request wants, listed anyway",
          edit=(SPEC_WANTED, "request.num_tokens, request.num_computed_tokens"),
          expect="RULE: speculative decoding: a running request also wants its drafts computed"),
    Wrong("schedule", "no lookahead slots for a drafter with its own KV cache",
          edit=(LOOKAHEAD_GUARD, "        return 0\n"),
          expect="Your step took FEWER new blocks than the reference's for the same tokens"),
    Wrong("schedule", "lookahead slots in every allocation, prefill chunks included (vLLM's way)",
          edit=(LOOKAHEAD_GUARD, ""),
          expect="Your step took MORE new blocks than the reference's for the same tokens"),
    Wrong("schedule", "lookahead slots past max_request_len",
          edit=(LOOKAHEAD_CAP, "return self.num_lookahead_tokens"),
          expect="never past self.max_request_len tokens in all"),
    Wrong("schedule", "lookahead slots in the running pass only",
          edit=("        num_slots = num_new_tokens + lookahead(request, num_hit_tokens + num_new_tokens)\n",
                "        num_slots = num_new_tokens\n"),
          expect="Your step took FEWER new blocks than the reference's for the same tokens"),
    Wrong("schedule", "an undone victim keeps its drafts in the step",
          edit=("                scheduled_spec_decode_tokens.pop(victim.request_id, None)\n", ""),
          expect="RULE: a victim undone in the step that scheduled it leaves the step with everything"),
    Wrong("schedule", "the decisions per step are shown up to the first difference",
          edit=("while (not preempted and self.waiting", "while (self.waiting"),
          expect="<- first difference"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("05_scheduler", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)


def test_a_failing_plug_names_the_step_the_request_and_expected_vs_got():
    """The "Plug it in" cell compares timelines with expect_same_timeline: never a bare AssertionError."""
    from types import SimpleNamespace

    from labs.checks.p05 import expect_same_timeline

    def step(index, counts, preempted=()):
        return SimpleNamespace(step=index, num_scheduled_tokens=counts, preempted=list(preempted), finished=[])

    reference = SimpleNamespace(steps=[step(1, {"r0": 8, "r1": 3}), step(2, {"r0": 6, "r1": 1}, ["r2"])])
    mine = SimpleNamespace(steps=[step(1, {"r0": 8, "r1": 3}), step(2, {"r0": 6, "r1": 1, "r3": 5}, ["r2"])])
    with pytest.raises(AssertionError) as failure:
        expect_same_timeline(mine, reference)
    message = str(failure.value)
    assert "engine step 2" in message and "['r3']" in message
    assert "expected {'r0': 6, 'r1': 1}" in message and "got {'r0': 6, 'r1': 1, 'r3': 5}" in message
    expect_same_timeline(reference, reference)
