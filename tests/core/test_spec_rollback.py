"""The scheduler's side of speculative decoding under random acceptance patterns (hypothesis).

A fake runner (tests/core/test_scheduler.py's, extended) writes every scheduled token's "KV", drafts
included, into a token-id cache by slot, verifies the drafts greedily against the phase-05 fake model
reading that cache back through the block table, and proposes random drafts (some right, some wrong).
Whatever the pattern, each request's tokens equal a run without speculation, the KV read back is always
the request's real tokens (a rejected draft's slot is overwritten before anyone reads it), and no block
leaks or keeps a reference.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from labs.checks.p05 import next_token
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.scheduler import rollback_spec_tokens
from mini.runner_outputs import ModelRunnerOutput
from tests.core.test_scheduler import (
    FakeRunner,
    build_requests,
    make_scheduler,
    request_specs,
    run_to_completion,
)

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


class SpecFakeRunner(FakeRunner):
    """FakeRunner that feeds scheduled drafts, verifies them greedily and proposes random next drafts."""

    def __init__(self, num_gpu_blocks: int, block_size: int, k: int, seed: int, right_draft_rate: float) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self.k = k
        self.rng = random.Random(seed)
        self.right_draft_rate = right_draft_rate
        self.num_accepted = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in out.finished_req_ids:
            self.states.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.states[new.req_id] = {"tokens": new.prompt_token_ids + new.output_token_ids,
                                       "block_ids": list(new.block_ids), "computed": new.num_computed_tokens}
        cached = out.scheduled_cached_reqs
        for req_id, new_ids, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens,
                                             strict=False):
            state = self.states[req_id]
            state["computed"] = computed           # rolled back by the scheduler after rejections
            state["block_ids"].extend(new_ids)
        req_ids = list(out.num_scheduled_tokens)
        sampled, drafts_out = [], []
        for req_id in req_ids:
            state = self.states[req_id]
            drafts = out.scheduled_spec_decode_tokens.get(req_id, [])
            fed = state["tokens"] + drafts
            start, count = state["computed"], out.num_scheduled_tokens[req_id]
            assert start + count == len(fed) or (not drafts and start + count < len(state["tokens"])), \
                "a request with drafts must be scheduled its last token and every draft"
            for position in range(start, start + count):
                self.kv_slots[self.slot(state, position)] = fed[position]
            state["computed"] = start + count
            if state["computed"] < len(state["tokens"]):
                sampled.append([])
                drafts_out.append([])
                continue
            emitted = []
            for j in range(len(drafts) + 1):
                end = len(state["tokens"]) + j
                context = [self.kv_slots[self.slot(state, p)] for p in range(end)]
                assert context == state["tokens"] + drafts[:j], "KV read back through the block table is wrong"
                target = next_token(context)
                emitted.append(target)
                if j == len(drafts) or drafts[j] != target:
                    break
            self.num_accepted += len(emitted) - 1
            state["tokens"] += emitted
            sampled.append(emitted)
            drafts_out.append(self._propose(state["tokens"]))
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, spec_token_ids=drafts_out)

    def _propose(self, tokens: list[int]) -> list[int]:
        drafts, context = [], list(tokens)
        for _ in range(self.rng.randint(0, self.k)):
            right = next_token(context)
            token = right if self.rng.random() < self.right_draft_rate else (right + 1 + self.rng.randint(0, 5)) % 97
            drafts.append(token)
            context.append(token)
        return drafts


def test_rollback_spec_tokens_counts():
    assert rollback_spec_tokens(10, 3, 1) == (7, 0)   # all 3 drafts rejected: back to 7, nothing accepted
    assert rollback_spec_tokens(10, 3, 4) == (10, 3)  # all accepted + bonus: nothing to roll back
    assert rollback_spec_tokens(10, 3, 2) == (8, 1)


@settings(max_examples=int(os.environ.get("MINI_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    block_size=st.sampled_from([1, 2, 4]),
    spare_blocks=st.integers(0, 6),
    budget=st.integers(2, 24),
    k=st.integers(1, 4),
    method=st.sampled_from(["ngram", "draft_model"]),   # draft_model: k lookahead slots per allocation
    right_draft_rate=st.sampled_from([0.0, 0.5, 0.9]),
    enable_caching=st.booleans(),
    seed=st.integers(0, 1000),
)
# Found by hypothesis: a prefill chunk that reserved lookahead slots published blocks it never wrote as
# prefix-cache hits; a later request sharing the prompt then read unwritten KV.
@example(specs=[([1, 1], 1, 0, 0, False, 0), ([1], 3, 0, 0, False, 0), ([1] * 7, 1, 0, 0, False, 0)],
         block_size=1, spare_blocks=0, budget=2, k=1, method="draft_model", right_draft_rate=0.0,
         enable_caching=True, seed=0)
def test_any_acceptance_pattern_gives_the_same_tokens_and_frees_every_block(
        specs, block_size, spare_blocks, budget, k, method, right_draft_rate, enable_caching, seed):
    longest = max(len(prompt) + max_tokens for prompt, max_tokens, *_ in specs)
    num_gpu_blocks = -(-(longest + k) // block_size) + spare_blocks + 1
    spec = {"method": method, "num_speculative_tokens": k}
    scheduler = make_scheduler(num_gpu_blocks, block_size, enable_caching, max_num_batched_tokens=budget,
                               max_num_seqs=4, speculative_config=spec)
    runner = SpecFakeRunner(num_gpu_blocks, block_size, k, seed, right_draft_rate)
    requests, abort_at = build_requests(specs, with_aborts=True)
    tokens, reasons, _ = run_to_completion(scheduler, requests, abort_at, runner=runner)

    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_usable_blocks, "blocks leaked"
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert scheduler.requests == {} and not scheduler.running and not scheduler.waiting

    ref_requests, _ = build_requests(specs, with_aborts=False)
    ref_tokens, ref_reasons, _ = run_to_completion(make_scheduler(4096, block_size), ref_requests)
    for request in requests:
        rid = request.request_id
        if reasons[rid] == "abort":
            assert tokens[rid] == ref_tokens[rid][:len(tokens[rid])]
        else:
            assert tokens[rid] == ref_tokens[rid] and reasons[rid] == ref_reasons[rid] == "length"
    stats = scheduler.spec_decoding_stats
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    if right_draft_rate == 0.0:
        # A wrong draft can still be right by chance only if the wrong token equals the right one: never here.
        assert stats.num_accepted_tokens == 0


def _spec_scheduler(**overrides):
    return make_scheduler(64, 4, max_num_batched_tokens=overrides.pop("budget", 64), max_num_seqs=4,
                          speculative_config={"method": "ngram", "num_speculative_tokens": 2}, **overrides)


def _runner_output(out: SchedulerOutput, sampled: list[list[int]], drafts: list[list[int]]) -> ModelRunnerOutput:
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, spec_token_ids=drafts)


def test_a_step_that_returned_no_token_records_no_draft_and_rolls_nothing_back():
    """vLLM's `update_from_output` verifies drafts only when the step generated tokens: a row that came back
    empty (nothing sampled) must not record a draft with -1 accepted tokens nor move num_computed_tokens."""
    from tests.core.test_scheduler import make_request

    scheduler = _spec_scheduler()
    scheduler.add_request(make_request("r", [1, 2, 3, 4, 5], max_tokens=8))
    out = scheduler.schedule()
    scheduler.update_from_output(out, _runner_output(out, [[6]], [[7, 8]]))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"r": [7, 8]} and out.num_scheduled_tokens == {"r": 3}
    request = scheduler.requests["r"]
    computed = request.num_computed_tokens
    outputs = scheduler.update_from_output(out, _runner_output(out, [[]], [[]]))
    assert outputs == [] and request.num_computed_tokens == computed
    stats = scheduler.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (0, 0, 0)


def test_drafts_returned_for_a_mid_prefill_row_are_dropped_by_the_scheduler():
    """vLLM's `update_draft_token_ids` ignores drafts for a request that is still a prefill chunk; mini's
    scheduler does too, whatever the drafter returned for that row."""
    from tests.core.test_scheduler import make_request

    scheduler = _spec_scheduler(budget=4)
    scheduler.add_request(make_request("r", list(range(1, 11)), max_tokens=8))
    out = scheduler.schedule()
    assert out.partial_prefill_req_ids == {"r"}
    scheduler.update_from_output(out, _runner_output(out, [[]], [[7, 8]]))
    assert scheduler.requests["r"].spec_token_ids == []
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {} and out.num_scheduled_tokens == {"r": 4}
