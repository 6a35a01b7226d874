"""The scheduler: token budget, max_num_seqs, chunked prefill, preemption, stops, aborts, and a
property-based check that any schedule produces the same tokens as an unconstrained run."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.checks.p05 import next_token  # the phase-05 lab's fake model
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.request_queue import SchedulingPolicy, create_request_queue
from mini.core.sched.scheduler import Scheduler, num_tokens_to_schedule, select_preemption_victim
from mini.metrics.stats import PoolSnapshot, SchedulerStats
from mini.runner_outputs import ModelRunnerOutput
from mini.sampling_params import SamplingParams

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

EOS = 0


def make_config(**overrides) -> EngineConfig:
    values = {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 1024,
              "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs"}
    values.update(overrides)
    return EngineConfig(**values)


def make_scheduler(num_gpu_blocks: int = 64, block_size: int = 4, enable_caching: bool = False,
                   **overrides) -> Scheduler:
    manager = KVCacheManager(num_gpu_blocks, block_size, enable_caching)
    return Scheduler(make_config(**overrides), manager)


def make_request(request_id: str, prompt: list[int], max_tokens: int = 16, priority: int = 0,
                 arrival_time: float = 0.0, eos: int | None = None, **params) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_id=eos, arrival_time=arrival_time, priority=priority)


class FakeRunner:
    """Keeps per-request state only from SchedulerOutputs (as a real runner must) and a token-id
    'KV cache' indexed by slot: the sampled token is computed from what the block table reads back,
    so a wrong block table or a bad prefix hit changes the output."""

    def __init__(self, num_gpu_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.kv_slots: list[int | None] = [None] * (num_gpu_blocks * block_size)
        self.states: dict[str, dict] = {}

    def slot(self, state: dict, position: int) -> int:
        block_id = state["block_ids"][position // self.block_size]
        assert block_id != 0, "the null block must never hold KV"
        return block_id * self.block_size + position % self.block_size

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in out.finished_req_ids:
            self.states.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.states
            self.states[new.req_id] = {"tokens": new.prompt_token_ids + new.output_token_ids,
                                       "block_ids": list(new.block_ids), "computed": new.num_computed_tokens}
        cached = out.scheduled_cached_reqs
        for req_id, new_ids, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens,
                                             strict=False):
            state = self.states[req_id]
            assert state["computed"] == computed
            state["block_ids"].extend(new_ids)
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        # Store every scheduled token's "KV" first (as each layer does), then read.
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            state = self.states[req_id]
            start, end = state["computed"], state["computed"] + num_tokens
            assert num_tokens > 0 and end <= len(state["tokens"])
            for position in range(start, end):
                self.kv_slots[self.slot(state, position)] = state["tokens"][position]
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            state = self.states[req_id]
            state["computed"] += out.num_scheduled_tokens[req_id]
            if state["computed"] < len(state["tokens"]):
                sampled.append([])  # mid-prefill: no token
                continue
            context = [self.kv_slots[self.slot(state, p)] for p in range(state["computed"])]
            assert context == state["tokens"], "KV read back through the block table is wrong"
            token = next_token(context)
            state["tokens"].append(token)
            sampled.append([token])
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)


def run_to_completion(scheduler: Scheduler, requests: list[Request], abort_at: dict[str, int] | None = None,
                      max_steps: int = 2000, runner: FakeRunner | None = None,
                      ) -> tuple[dict[str, list[int]], dict[str, str], list[SchedulerOutput]]:
    """Drive the scheduler with the fake runner; return each request's tokens and finish reason."""
    manager = scheduler.kv_cache_manager
    runner = runner or FakeRunner(manager.block_pool.num_gpu_blocks, manager.block_size)
    arrivals: dict[int, list[Request]] = {}
    for request in requests:
        arrivals.setdefault(int(request.arrival_time), []).append(request)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    reasons: dict[str, str] = {}
    outputs = []
    step = 0
    while step < max_steps:
        for request in arrivals.pop(step, []):
            scheduler.add_request(request)
        for req_id, abort_step in (abort_at or {}).items():
            if abort_step == step and req_id not in reasons:
                scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
                reasons[req_id] = "abort"
        if not scheduler.has_unfinished_requests() and not arrivals:
            break
        step += 1
        out = scheduler.schedule()
        assert out.total_num_scheduled_tokens <= scheduler.max_num_scheduled_tokens
        assert len(out.num_scheduled_tokens) <= scheduler.max_num_running_reqs
        outputs.append(out)
        for core_output in scheduler.update_from_output(out, runner.execute(out)):
            tokens[core_output.request_id].extend(core_output.new_token_ids)
            if core_output.finish_reason is not None:
                reasons[core_output.request_id] = core_output.finish_reason
    assert step < max_steps, "the scheduler made no progress"
    return tokens, reasons, outputs


# ---------------------------------------------------------------- basic scheduling
def test_worked_example_blocks_and_decode():
    scheduler = make_scheduler(num_gpu_blocks=10, block_size=4)
    prompts = [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]]
    for index, prompt in enumerate(prompts):
        scheduler.add_request(make_request(f"r{index}", prompt))
    runner = FakeRunner(10, 4)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 5, "r1": 7, "r2": 3}
    assert [n.block_ids for n in out.scheduled_new_reqs] == [[1, 2], [3, 4], [5]]
    assert [n.num_computed_tokens for n in out.scheduled_new_reqs] == [0, 0, 0]
    assert out.partial_prefill_req_ids == set()
    scheduler.update_from_output(out, runner.execute(out))
    out = scheduler.schedule()
    assert out.scheduled_new_reqs == []
    assert out.scheduled_cached_reqs.req_ids == ["r0", "r1", "r2"]
    assert out.scheduled_cached_reqs.new_block_ids == [[], [], []]
    assert out.scheduled_cached_reqs.num_computed_tokens == [5, 7, 3]
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1, "r2": 1}
    assert [scheduler.kv_cache_manager.get_block_ids(r) for r in ("r0", "r1", "r2")] == [[1, 2], [3, 4], [5]]
    assert [scheduler.requests[r].num_computed_tokens for r in ("r0", "r1", "r2")] == [6, 8, 4]


def test_token_budget_and_max_num_seqs():
    scheduler = make_scheduler(max_num_batched_tokens=10, max_num_seqs=2)
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", [index + 1] * 4))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 4, "r1": 4}   # max_num_seqs stops r2
    assert out.total_num_scheduled_tokens == 8
    assert len(scheduler.waiting) == 1


def test_chunked_prefill_by_budget_and_threshold():
    scheduler = make_scheduler(max_num_batched_tokens=8, long_prefill_token_threshold=5)
    scheduler.add_request(make_request("long", list(range(1, 13))))   # 12 tokens
    scheduler.add_request(make_request("short", [7, 8]))
    runner = FakeRunner(64, 4)
    sizes = []
    for _ in range(4):
        out = scheduler.schedule()
        sizes.append(dict(out.num_scheduled_tokens))
        if len(sizes) == 1:
            assert out.partial_prefill_req_ids == {"long"}
        core_outputs = scheduler.update_from_output(out, runner.execute(out))
        if len(sizes) < 3:
            assert "long" not in [o.request_id for o in core_outputs]  # mid-prefill: no output
    # threshold 5 caps each chunk of "long"; "short" gets the rest of the budget
    assert sizes[0] == {"long": 5, "short": 2}
    assert sizes[1] == {"long": 5, "short": 1}
    assert sizes[2] == {"long": 2, "short": 1}
    assert sizes[3] == {"long": 1, "short": 1}


def test_budget_chunks_a_prompt_and_no_chunking_waits():
    scheduler = make_scheduler(max_num_batched_tokens=6)
    scheduler.add_request(make_request("a", list(range(1, 11))))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 6} and out.partial_prefill_req_ids == {"a"}
    no_chunks = make_scheduler(max_num_batched_tokens=6, enable_chunked_prefill=False, max_model_len=6)
    no_chunks.add_request(make_request("small", [1, 2]))
    no_chunks.add_request(make_request("big", list(range(1, 6))))
    out = no_chunks.schedule()
    assert out.num_scheduled_tokens == {"small": 2}       # "big" (5 > 4 left) waits whole


def test_priority_waiting_order():
    scheduler = make_scheduler(max_num_seqs=2, scheduling_policy="priority")
    scheduler.add_request(make_request("late-low", [1], priority=5, arrival_time=0.0))
    scheduler.add_request(make_request("urgent", [2], priority=0, arrival_time=2.0))
    scheduler.add_request(make_request("early", [3], priority=1, arrival_time=1.0))
    out = scheduler.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["urgent", "early"]


def _drive_until_preemption(scheduler: Scheduler, runner: FakeRunner) -> SchedulerOutput:
    for _ in range(50):
        out = scheduler.schedule()
        if out.preempted_req_ids:
            return out
        scheduler.update_from_output(out, runner.execute(out))
    raise AssertionError("expected a preemption")


def test_fcfs_preempts_the_most_recent_and_it_reprefills_its_tokens():
    # 5 usable blocks of 2 tokens; three prompts of 3 tokens take 2 blocks each -> must preempt soon.
    scheduler = make_scheduler(num_gpu_blocks=7, block_size=2)
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", [index + 1] * 3, max_tokens=4, arrival_time=index))
    runner = FakeRunner(7, 2)
    out = _drive_until_preemption(scheduler, runner)
    assert out.preempted_req_ids == {"r2"} and "r2" in out.finished_req_ids
    victim = scheduler.requests["r2"]
    assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert victim.num_preemptions == 1 and scheduler.num_preemptions_total == 1
    assert scheduler.waiting.peek_request() is victim
    assert scheduler.kv_cache_manager.get_block_ids("r2") == []
    tokens_before = list(victim.all_token_ids)
    assert len(tokens_before) > 3
    scheduler.update_from_output(out, runner.execute(out))
    resumed = None
    for _ in range(50):
        out = scheduler.schedule()
        resumed = next((n for n in out.scheduled_new_reqs if n.req_id == "r2"), None)
        if resumed:
            break
        scheduler.update_from_output(out, runner.execute(out))
    assert resumed is not None
    assert resumed.prompt_token_ids + resumed.output_token_ids == tokens_before
    assert resumed.num_computed_tokens == 0 and out.num_scheduled_tokens["r2"] == len(tokens_before)


def test_priority_preempts_the_lowest_priority_request():
    scheduler = make_scheduler(num_gpu_blocks=7, block_size=2, scheduling_policy="priority")
    scheduler.add_request(make_request("mid", [1] * 3, max_tokens=6, priority=1, arrival_time=0.0))
    scheduler.add_request(make_request("worst", [2] * 3, max_tokens=6, priority=9, arrival_time=1.0))
    scheduler.add_request(make_request("best", [3] * 3, max_tokens=6, priority=0, arrival_time=2.0))
    runner = FakeRunner(7, 2)
    out = _drive_until_preemption(scheduler, runner)
    assert out.preempted_req_ids == {"worst"}
    assert "worst" not in out.num_scheduled_tokens
    assert scheduler.requests["worst"].status == RequestStatus.PREEMPTED


def test_finished_and_aborted_requests_free_blocks_at_once():
    scheduler = make_scheduler(num_gpu_blocks=10, block_size=4)
    pool = scheduler.kv_cache_manager.block_pool
    scheduler.add_request(make_request("done", [1, 2, 3], max_tokens=1))
    scheduler.add_request(make_request("abort-running", [4, 5, 6, 7, 8]))
    scheduler.add_request(make_request("abort-waiting", [9]))
    scheduler.max_num_running_reqs = 2
    runner = FakeRunner(10, 4)
    out = scheduler.schedule()
    core_outputs = scheduler.update_from_output(out, runner.execute(out))
    done = next(o for o in core_outputs if o.request_id == "done")
    assert done.finish_reason == "length" and len(done.new_token_ids) == 1
    assert "done" not in scheduler.requests and pool.get_num_free_blocks() == 9 - 2
    scheduler.finish_requests(["abort-running", "abort-waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert pool.get_num_free_blocks() == 9
    assert not scheduler.has_unfinished_requests() and scheduler.get_num_unfinished_requests() == 0
    out = scheduler.schedule()
    assert out.finished_req_ids == {"done", "abort-running", "abort-waiting"}
    assert out.num_scheduled_tokens == {}
    with pytest.raises(ValueError, match="finished_status"):
        scheduler.finish_requests(["x"], RequestStatus.RUNNING)


def test_stop_conditions_eos_min_tokens_stop_ids_and_max_model_len():
    def finish(request: Request, **config) -> tuple[list[int], str]:
        scheduler = make_scheduler(**config)
        tokens, reasons, _ = run_to_completion(scheduler, [request])
        return tokens[request.request_id], reasons[request.request_id]

    prompt = [5, 6, 7]
    free_run, reason = finish(make_request("free", prompt, max_tokens=12))
    assert len(free_run) == 12 and reason == "length"
    eos = free_run[3]
    first_eos = free_run.index(eos)
    got, reason = finish(make_request("eos", prompt, max_tokens=12, eos=eos))
    assert got == free_run[:first_eos + 1] and reason == "stop"
    got, reason = finish(make_request("ignore", prompt, max_tokens=12, eos=eos, ignore_eos=True))
    assert got == free_run and reason == "length"
    # min_tokens does not gate EOS in check_stop (vLLM v0.33.0): the MinTokensLogitsProcessor keeps EOS
    # from being sampled; this fake runner has no sampler, so its EOS ends the request
    got, reason = finish(make_request("min", prompt, max_tokens=12, eos=eos, min_tokens=first_eos + 2))
    assert got == free_run[:first_eos + 1] and reason == "stop"
    got, reason = finish(make_request("stopid", prompt, max_tokens=12, stop_token_ids=[eos]))
    assert got == free_run[:first_eos + 1] and reason == "stop"
    got, reason = finish(make_request("short", prompt, max_tokens=12), max_model_len=7)
    assert got == free_run[:4] and reason == "length"


# ---------------------------------------------------------------- property: any schedule, same tokens
request_specs = st.lists(
    st.tuples(
        st.lists(st.integers(1, 4), min_size=1, max_size=14),   # prompt (small alphabet: shared prefixes)
        st.integers(1, 8),                                       # max_tokens
        st.integers(0, 6),                                       # arrival step
        st.integers(0, 3),                                       # priority
        st.booleans(),                                           # aborted?
        st.integers(0, 12),                                      # abort step
    ),
    min_size=1, max_size=6,
)


def build_requests(specs, with_aborts: bool) -> tuple[list[Request], dict[str, int]]:
    requests, abort_at = [], {}
    for index, (prompt, max_tokens, arrival, priority, aborted, abort_step) in enumerate(specs):
        requests.append(make_request(f"r{index}", prompt, max_tokens=max_tokens, priority=priority,
                                     arrival_time=float(arrival)))
        if with_aborts and aborted:
            abort_at[f"r{index}"] = abort_step
    return requests, abort_at


# MINI_HYPOTHESIS_EXAMPLES=3000 for a long soak.
@settings(max_examples=int(os.environ.get("MINI_HYPOTHESIS_EXAMPLES", "50")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    block_size=st.sampled_from([1, 2, 4]),
    spare_blocks=st.integers(0, 6),
    budget=st.integers(1, 24),
    threshold=st.sampled_from([0, 3]),
    max_num_seqs=st.integers(1, 4),
    policy=st.sampled_from(["fcfs", "priority"]),
    enable_caching=st.booleans(),
    chunked=st.booleans(),
)
def test_any_schedule_gives_the_unconstrained_tokens(specs, block_size, spare_blocks, budget, threshold,
                                                     max_num_seqs, policy, enable_caching, chunked):
    longest = max(len(prompt) + max_tokens for prompt, max_tokens, *_ in specs)
    # Tight: just enough blocks for the longest request alone (+ a few), plus the null block.
    num_gpu_blocks = -(-longest // block_size) + spare_blocks + 1
    if not chunked:
        budget = max(budget, longest)
    constrained = make_scheduler(
        num_gpu_blocks, block_size, enable_caching, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=threshold, scheduling_policy=policy, enable_chunked_prefill=chunked,
        max_model_len=1024 if chunked else budget)
    requests, abort_at = build_requests(specs, with_aborts=True)
    tokens, reasons, outputs = run_to_completion(constrained, requests, abort_at)

    pool = constrained.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_usable_blocks, "blocks leaked"
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert constrained.requests == {} and not constrained.running and not constrained.waiting

    reference = make_scheduler(4096, block_size)
    ref_requests, _ = build_requests(specs, with_aborts=False)
    ref_tokens, ref_reasons, _ = run_to_completion(reference, ref_requests)
    for request in requests:
        rid = request.request_id
        assert rid in reasons, f"{rid} never finished"
        if reasons[rid] == "abort":
            assert tokens[rid] == ref_tokens[rid][:len(tokens[rid])]
        else:
            assert tokens[rid] == ref_tokens[rid] and reasons[rid] == ref_reasons[rid] == "length"
    if not chunked:
        assert all(not out.partial_prefill_req_ids for out in outputs)


def _lone_then_priority(prompt_len: int, with_companion: bool = False) -> tuple[Scheduler, list[Request]]:
    """Block size 4, 9 blocks, budget 16, threshold 8, priority policy, caching on: a priority-2 request of
    `prompt_len` tokens, and an 8-token priority-0 one arriving a step later (labs/checks/p05.py has the same
    workloads). `with_companion`: a one-token priority-1 request at step 0, so the first is never alone."""
    scheduler = make_scheduler(num_gpu_blocks=9, block_size=4, enable_caching=True, max_num_batched_tokens=16,
                               long_prefill_token_threshold=8, scheduling_policy="priority", max_num_seqs=3)
    requests = [make_request("low", [1 + j % 30 for j in range(prompt_len)], max_tokens=4, priority=2,
                             arrival_time=0.0),
                make_request("high", [31 + j for j in range(8)], max_tokens=4, priority=0, arrival_time=1.0)]
    if with_companion:
        requests.append(make_request("one", [50], max_tokens=1, priority=1, arrival_time=0.0))
    return scheduler, requests


def _step_through(scheduler: Scheduler, requests: list[Request], num_steps: int) -> list[SchedulerOutput]:
    runner = FakeRunner(scheduler.kv_cache_manager.block_pool.num_gpu_blocks, scheduler.kv_cache_manager.block_size)
    outputs = []
    for step in range(num_steps):
        for request in requests:
            if int(request.arrival_time) == step:
                scheduler.add_request(request)
        outputs.append(scheduler.schedule())
        scheduler.update_from_output(outputs[-1], runner.execute(outputs[-1]))
    return outputs


def test_a_lone_request_is_not_capped_by_long_prefill_token_threshold():
    """vLLM: the threshold exists so one prefill does not starve others; alone, a request uses the budget."""
    scheduler, requests = _lone_then_priority(24)
    outputs = _step_through(scheduler, requests, 2)
    assert outputs[0].num_scheduled_tokens == {"low": 16}              # alone: the whole budget
    assert outputs[1].num_scheduled_tokens == {"low": 8, "high": 8}    # two requests: the threshold caps both
    assert scheduler.long_prefill_token_threshold_for_step() == 8


def test_priority_self_preemption_lets_the_running_pass_go_on():
    """vLLM `continue`s after a priority-policy request preempts itself: the more important requests after
    it in `running` are still scheduled in that step (the blocks it freed may be just what they need)."""
    scheduler, requests = _lone_then_priority(24)
    outputs = _step_through(scheduler, requests, 3)
    # Step 2: "low" (24 tokens computed, 6 blocks) needs a 7th block for its decode; the pool is full and it
    # is the worst request, so it preempts itself; "high" still decodes, in the block "low" gave back.
    assert outputs[2].preempted_req_ids == {"low"} and outputs[2].num_scheduled_tokens == {"high": 1}
    tokens, reasons, _ = run_to_completion(*_lone_then_priority(24))
    ref_tokens, _, _ = run_to_completion(make_scheduler(64, 4), _lone_then_priority(24)[1])
    assert tokens == ref_tokens and set(reasons.values()) == {"length"}


def test_priority_preemption_after_scheduling_uncaches_unwritten_blocks():
    """A worse-priority request scheduled earlier in the same step can be preempted: the blocks it just got
    were cached at allocation but never written, so they must not become prefix hits (mini's own rule:
    vLLM v0.33.0 frees them with their hashes)."""
    scheduler, requests = _lone_then_priority(24, with_companion=True)
    outputs = _step_through(scheduler, requests, 3)
    # Step 2: "low" got blocks for its last 8 prompt tokens, then "high" needed a block: "low" is undone.
    assert outputs[2].preempted_req_ids == {"low"} and outputs[2].num_scheduled_tokens == {"high": 1}
    pool = scheduler.kv_cache_manager.block_pool
    # Cached: low's two written chunks (4 blocks) and high's prompt (2 blocks); not the unwritten ones.
    assert len(pool.cached_blocks()) == 6
    tokens, reasons, _ = run_to_completion(*_lone_then_priority(24, with_companion=True))
    ref_tokens, _, _ = run_to_completion(make_scheduler(64, 4), _lone_then_priority(24, with_companion=True)[1])
    assert tokens == ref_tokens and set(reasons.values()) == {"length"}


def test_without_uncaching_the_undone_victim_reads_unwritten_kv():
    """The same workload with `uncache_uncomputed_blocks` disabled: "low" comes back, hits its own block
    that was cached at allocation but never written, and the runner reads KV that is not there."""
    scheduler, requests = _lone_then_priority(24, with_companion=True)
    scheduler.kv_cache_manager.uncache_uncomputed_blocks = lambda request: None
    with pytest.raises(AssertionError, match="KV read back"):
        run_to_completion(scheduler, requests)


def test_priority_victim_tie_is_the_first_in_running():
    """vLLM: `max(running, key=(priority, arrival_time))` keeps the first of equal requests."""
    running = [make_request(name, [1], priority=priority, arrival_time=arrival)
               for name, priority, arrival in [("a", 1, 0.0), ("b", 1, 0.0), ("c", 0, 5.0)]]
    assert select_preemption_victim(running, SchedulingPolicy.PRIORITY).request_id == "a"
    assert select_preemption_victim(running, SchedulingPolicy.FCFS).request_id == "c"


def test_priority_queue_ties_go_by_request_id():
    """vLLM's `Request.__lt__`: priority, then arrival_time, then request_id; a preempted request goes back
    into the heap like any other (no front in a priority queue)."""
    queue = create_request_queue(SchedulingPolicy.PRIORITY)
    for name in ["r2", "r1", "r3"]:
        queue.add_request(make_request(name, [1], priority=0, arrival_time=1.0))
    queue.prepend_request(make_request("r9", [1], priority=0, arrival_time=1.0))
    queue.add_request(make_request("r5", [1], priority=0, arrival_time=0.5))
    assert [r.request_id for r in queue] == ["r5", "r1", "r2", "r3", "r9"]


def test_length_cap_keeps_a_position_for_the_sampled_token():
    """vLLM schedules at most max_model_len - num_computed_tokens - 1 tokens (the token sampled after the
    step needs a position too) and refuses a prompt of max_model_len tokens."""
    assert num_tokens_to_schedule(64, 62, 16, 0, 63) == 0
    assert num_tokens_to_schedule(64, 60, 16, 0, 63) == 2
    scheduler = make_scheduler(max_model_len=8)
    with pytest.raises(ValueError, match="at most 7 fit"):
        scheduler.add_request(make_request("full", list(range(1, 9))))
    tokens, reasons, _ = run_to_completion(scheduler, [make_request("fits", list(range(1, 8)), max_tokens=5)])
    assert len(tokens["fits"]) == 1 and reasons["fits"] == "length"   # 7 + 1 = max_model_len


def test_add_request_rejects_what_can_never_fit():
    scheduler = make_scheduler(num_gpu_blocks=4, block_size=4, max_model_len=20)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        scheduler.add_request(make_request("pool", list(range(12))))     # pool holds 3 x 4 = 12 tokens
    roomy = make_scheduler(num_gpu_blocks=64, block_size=4, max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len=8"):
        roomy.add_request(make_request("long", list(range(9))))
    scheduler.add_request(make_request("ok", list(range(11))))      # and one for the token it samples
    with pytest.raises(ValueError, match="already"):
        scheduler.add_request(make_request("ok", [1]))
    assert scheduler.get_num_unfinished_requests() == 1


def test_request_outgrowing_the_whole_pool_finishes_with_length():
    scheduler = make_scheduler(num_gpu_blocks=3, block_size=2)                # 4 token slots in all
    tokens, reasons, _ = run_to_completion(scheduler, [make_request("r", [1, 2, 3], max_tokens=10)])
    assert len(tokens["r"]) == 1 and reasons["r"] == "length"                 # 3 + 1 = 4 tokens
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 2


def test_stats_and_pool_snapshot_copy_counts_tables_and_queue():
    """`SchedulerStats` (counters, what stat loggers get) and `PoolSnapshot` (what views and tests read)."""
    scheduler = make_scheduler(num_gpu_blocks=7, block_size=2)
    requests = [make_request(f"r{i}", [i + 1] * 3, max_tokens=4, arrival_time=0.0) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    before, pool = SchedulerStats.from_scheduler(scheduler), PoolSnapshot.from_scheduler(scheduler)
    assert (before.step, before.num_running_reqs, before.num_waiting_reqs) == (0, 0, 3)
    assert pool.waiting_req_ids == ["r0", "r1", "r2"] and pool.free_block_ids == [1, 2, 3, 4, 5, 6]
    assert pool.block_ref_cnts == [0] * 7 and before.kv_cache_usage == 0.0
    out = scheduler.schedule()
    stats, pool = SchedulerStats.from_scheduler(scheduler), PoolSnapshot.from_scheduler(scheduler)
    assert out.num_scheduled_tokens == {"r0": 3, "r1": 3, "r2": 3}
    assert stats.step == 1 and pool.running_req_ids == ["r0", "r1", "r2"] and pool.waiting_req_ids == []
    assert pool.block_ids == {"r0": [1, 2], "r1": [3, 4], "r2": [5, 6]}
    assert pool.num_computed_tokens == {"r0": 3, "r1": 3, "r2": 3}   # advanced right after scheduling
    assert pool.free_block_ids == [] and stats.kv_cache_usage == 1.0
    assert pool.block_ref_cnts == [0, 1, 1, 1, 1, 1, 1] and pool.num_gpu_blocks == 7 and pool.block_size == 2
    preempted = False
    while scheduler.has_unfinished_requests():            # every request gets one token per finished prefill
        req_ids = list(out.num_scheduled_tokens)
        sampled = [[7] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else []
                   for r in req_ids]
        scheduler.update_from_output(out, ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                                                            sampled))
        out = scheduler.schedule()
        preempted |= bool(out.preempted_req_ids)
    assert preempted
    done, pool = SchedulerStats.from_scheduler(scheduler), PoolSnapshot.from_scheduler(scheduler)
    assert done.num_preemptions == scheduler.num_preemptions_total > 0
    assert pool.block_ids == {} and sorted(pool.free_block_ids) == [1, 2, 3, 4, 5, 6]
