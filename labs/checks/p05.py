"""Checks for phase 05 (the scheduler), against mini.core.sched.scheduler.

    check_num_tokens_to_schedule(num_tokens_to_schedule)
    check_select_preemption_victim(select_preemption_victim)
    check_schedule(schedule)

`check_schedule` is the capstone: it runs the same workload through two schedulers, one with the
reference `Scheduler.schedule` and one with the candidate bound as its `schedule` method, feeding both
the same fake model (the next token is a hash of the context), and compares every SchedulerOutput and
the scheduler state after every step. No model, no tensors: a few milliseconds per step.

The worked example of the phase: block_size 4, 12 KV blocks (11 usable: 44 token slots), a budget of
16 tokens per step, max_num_seqs 3, long_prefill_token_threshold 8, and six requests.

vLLM v0.33.0 (vllm/v1/core/sched/scheduler.py) is the authority for every rule graded here: the length
cap keeps a position for the sampled token (`max_model_len - num_computed_tokens - 1`), the priority
victim is `max(running, key=(priority, arrival_time))` (the first such on a tie), a request alone gets
no `long_prefill_token_threshold` cap, and a request that preempts itself under the priority policy lets
the running pass go on. tests/test_course_vllm_answers_p05.py runs vLLM's own victim choice and token
count through these checks. mini's own rule on top (vLLM frees them cached): blocks allocated this step to
a victim undone later in the same step are taken out of the prefix cache (`uncache_uncomputed_blocks`).
"""

from __future__ import annotations

import hashlib
import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request
from mini.core.sched import scheduler as reference
from mini.core.sched.request_queue import SchedulingPolicy
from mini.runner_outputs import ModelRunnerOutput
from mini.sampling_params import SamplingParams

VOCAB_SIZE = 50

WORKED_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 12,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 3,
    "long_prefill_token_threshold": 8,
    "enable_chunked_prefill": True,
    "scheduling_policy": "fcfs",
    "enable_prefix_caching": False,
    "max_model_len": 64,
}
# (prompt length, max_tokens): prefill chunks, long decodes, and a preemption when the pool runs dry.
WORKED_REQUESTS = [(14, 4), (3, 12), (20, 3), (5, 8), (9, 3), (4, 6)]


# ------------------------------------------------------------------------------ num_tokens_to_schedule
def _num_tokens_cases(seeds: Iterable[int]) -> list[dict[str, int]]:
    def case(num_tokens, computed, budget, threshold=0, max_model_len=64):
        return {
            "num_tokens": num_tokens,
            "num_computed_tokens": computed,
            "token_budget": budget,
            "long_prefill_token_threshold": threshold,
            "max_model_len": max_model_len,
        }

    cases = [
        case(14, 0, 16, threshold=8),  # r0 of the worked example: the threshold caps its first chunk at 8
        case(14, 8, 16, threshold=8),  # ... then the last 6
        case(20, 0, 5, threshold=8),  # the budget left this step is smaller than the threshold
        case(11, 10, 16),  # a decode: one token
        case(30, 0, 16),  # no threshold: as much as the budget allows
        case(30, 0, 0),  # no budget left
        case(64, 62, 16, max_model_len=63),  # the sampled token would sit at position 63: nothing fits
        case(64, 60, 16, max_model_len=63),  # 2 of 4: positions 60, 61; the token sampled lands at 62
        case(30, 10, 16, max_model_len=20),  # the length cap (9), below the budget
        case(30, 10, 16, threshold=12, max_model_len=20),  # the length cap binds after the threshold
        case(40, 0, 32, max_model_len=24),  # a long prompt: at most 23 of it
        case(5, 5, 16),  # nothing left to compute
        case(9, 3, 16, threshold=6),  # wanted == threshold: 6
    ]
    for seed in seeds:
        rng = random.Random(seed)
        num_tokens = rng.randint(1, 80)
        computed = rng.randint(0, num_tokens) if rng.random() < 0.8 else num_tokens - 1
        cases.append(
            case(
                num_tokens,
                computed,
                rng.randint(0, 40),
                rng.choice([0, 0, rng.randint(1, 20)]),
                rng.randint(computed + 1, 100),  # vLLM's domain: a request never reaches max_model_len computed
            )
        )
    return cases


def check_num_tokens_to_schedule(num_tokens_to_schedule: Callable, seeds: Iterable[int] = range(40)) -> None:
    cases = _num_tokens_cases(seeds)
    for inputs in cases:
        expected = reference.num_tokens_to_schedule(**inputs)
        with calling("num_tokens_to_schedule", inputs, expected=expected):
            got = num_tokens_to_schedule(*inputs.values())
        expect_equal(
            "num_tokens_to_schedule",
            inputs,
            expected,
            got,
            "wanted = num_tokens - num_computed_tokens; cap it by long_prefill_token_threshold (when > 0), "
            "by token_budget, and by the length limit: the token this step samples also needs a position "
            "below max_model_len; never below 0",
        )
    passed("check_num_tokens_to_schedule", len(cases))


# ------------------------------------------------------------------------------ select_preemption_victim
def _running(specs: list[tuple[int, float]]) -> list[Request]:
    return [
        Request(f"r{i}", [1], SamplingParams(max_tokens=4), priority=priority, arrival_time=arrival)
        for i, (priority, arrival) in enumerate(specs)
    ]


def _victim_cases(seeds: Iterable[int]) -> list[tuple[list[tuple[int, float]], SchedulingPolicy]]:
    fixed = [
        [(0, 0.0), (0, 1.0), (0, 2.0)],
        [(0, 0.0), (5, 1.0), (1, 2.0)],
        [(2, 3.0), (2, 1.0), (0, 2.0)],
        [(1, 0.0), (1, 0.0), (0, 0.0)],  # a tie: the first of the two
        [(0, 0.0)],
        [(2, 1.0), (0, 0.0), (2, 1.0), (2, 1.0)],  # a tie of three, not at the head
        [(1, 0.0), (1, 3.0), (0, 1.0)],  # same priority: the later arrival
        [(0, 5.0), (1, 0.0), (0, 9.0)],  # priority before arrival
    ]
    cases = [(specs, policy) for specs in fixed for policy in SchedulingPolicy]
    for seed in seeds:
        rng = random.Random(seed)
        specs = [(rng.randint(0, 3), float(rng.randint(0, 4))) for _ in range(rng.randint(1, 7))]
        cases.append((specs, rng.choice(list(SchedulingPolicy))))
    return cases


def check_select_preemption_victim(
    select_preemption_victim: Callable, seeds: Iterable[int] = range(40)
) -> None:
    cases = _victim_cases(seeds)
    for specs, policy in cases:
        inputs = {
            "running (request_id, priority, arrival_time), oldest admitted first": [
                (f"r{i}", p, a) for i, (p, a) in enumerate(specs)
            ],
            "policy": policy,
        }
        expected = reference.select_preemption_victim(_running(specs), policy).request_id
        running = _running(specs)
        passed_in = list(running)
        with calling("select_preemption_victim", inputs, expected=expected):
            got = select_preemption_victim(passed_in, policy)
        expect_equal(
            "select_preemption_victim: the running list after the call",
            inputs,
            [r.request_id for r in running],
            [r.request_id for r in passed_in],
            "only choose the victim: the scheduler takes it out of running itself (self._preempt)",
        )
        got_id = got.request_id if isinstance(got, Request) and any(got is r for r in running) else got
        expect_equal(
            "select_preemption_victim (the request_id of the victim)",
            inputs,
            expected,
            got_id,
            "FCFS: the request at the END of running (admitted last). PRIORITY: the largest "
            "(priority, arrival_time); on a tie the FIRST such request in running (as Python's max). "
            "Return the Request itself",
        )
    passed("check_select_preemption_victim", len(cases))


# ------------------------------------------------------------------------------ schedule (capstone)
def next_token(context: list[int]) -> int:
    """A deterministic fake model: the next token is a hash of the whole context."""
    digest = hashlib.blake2b(repr(context).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % VOCAB_SIZE


def make_scheduler(config: dict[str, Any]) -> reference.Scheduler:
    engine_config = EngineConfig(**{k: v for k, v in config.items() if k != "num_gpu_blocks"})
    manager = KVCacheManager(config["num_gpu_blocks"], config["block_size"], config["enable_prefix_caching"])
    return reference.Scheduler(engine_config, manager)


def fake_model_output(scheduler: reference.Scheduler, output: Any) -> ModelRunnerOutput:
    """One token per request whose prompt (and outputs) are now all computed; [] for a partial prefill."""
    req_ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append([next_token(request.all_token_ids)] if done else [])
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)


def summarize_output(output: Any) -> dict[str, Any]:
    cached = output.scheduled_cached_reqs
    return {
        "num_scheduled_tokens": list(output.num_scheduled_tokens.items()),
        "new_reqs (req_id, block_ids, num_computed_tokens)": [
            (r.req_id, list(r.block_ids), r.num_computed_tokens) for r in output.scheduled_new_reqs
        ],
        "cached_reqs (req_id, new_block_ids, num_computed_tokens)": list(
            zip(cached.req_ids, [list(b) for b in cached.new_block_ids], cached.num_computed_tokens)
        ),
        "preempted_req_ids": sorted(output.preempted_req_ids),
        "finished_req_ids": sorted(output.finished_req_ids),
        "partial_prefill_req_ids": sorted(output.partial_prefill_req_ids),
        "total_num_scheduled_tokens": output.total_num_scheduled_tokens,
    }


def summarize_state(scheduler: reference.Scheduler) -> dict[str, Any]:
    manager = scheduler.kv_cache_manager
    return {
        "running": [r.request_id for r in scheduler.running],
        "waiting": [r.request_id for r in scheduler.waiting],
        "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in scheduler.requests.values()},
        "status": {r.request_id: r.status.name for r in scheduler.requests.values()},
        "block_ids": {r.request_id: manager.get_block_ids(r.request_id) for r in scheduler.requests.values()},
        "num_free_blocks": manager.block_pool.get_num_free_blocks(),
        "prefix-cached block ids": sorted(block.block_id for block in manager.block_pool.cached_blocks()),
        "prefix-cache stats (requests, queries, hits, preempted: requests, queries, hits)": _stats(manager),
    }


def _stats(manager: KVCacheManager) -> tuple[int, ...]:
    stats = manager.prefix_cache_stats
    return (stats.requests, stats.queries, stats.hits, stats.preempted_requests, stats.preempted_queries,
            stats.preempted_hits)


def _add_requests(scheduler: reference.Scheduler, specs: list[dict[str, Any]], step: int) -> None:
    for spec in specs:
        if spec["arrive"] == step:
            scheduler.add_request(
                Request(
                    spec["id"],
                    list(spec["prompt"]),
                    SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True),
                    arrival_time=float(spec["arrival_time"]),
                    priority=spec["priority"],
                )
            )


def worked_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    specs = [
        {
            "id": f"r{i}",
            "prompt": [1 + (7 * i + j) % 40 for j in range(n)],
            "max_tokens": m,
            "arrive": 0,
            "arrival_time": i,
            "priority": 0,
        }
        for i, (n, m) in enumerate(WORKED_REQUESTS)
    ]
    return dict(WORKED_CONFIG), specs


def priority_workload(enable_prefix_caching: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Low-priority r0 is admitted first; important r1 and r2 arrive a step later and share r0's prefix.

    When the pool runs dry, the victim (r0) sits BEFORE the request being scheduled in `running` and was
    already scheduled this step: its tokens and blocks must be handed back.
    """
    config = {
        **WORKED_CONFIG,
        "num_gpu_blocks": 8,
        "max_num_batched_tokens": 32,
        "long_prefill_token_threshold": 0,
        "scheduling_policy": "priority",
        "enable_prefix_caching": enable_prefix_caching,
        "max_num_seqs": 4,
    }
    prefix = [5, 6, 7, 8, 9, 10, 11, 12]
    specs = [
        {"id": "r0", "prompt": prefix[:7], "max_tokens": 10, "arrive": 0, "arrival_time": 0.0, "priority": 2},
        {
            "id": "r1",
            "prompt": [3, *prefix[:6]],
            "max_tokens": 10,
            "arrive": 1,
            "arrival_time": 1.0,
            "priority": 0,
        },
        {"id": "r2", "prompt": prefix[:5], "max_tokens": 8, "arrive": 1, "arrival_time": 1.0, "priority": 1},
        {
            "id": "r3",
            "prompt": prefix[:7] + [1, 2],
            "max_tokens": 4,
            "arrive": 6,
            "arrival_time": 2.0,
            "priority": 0,
        },
    ]
    return config, specs


def lone_then_priority_workload(prompt_len: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A low-priority request alone for one step (no long_prefill_token_threshold cap: it takes the whole
    budget), then an important one arrives and the pool runs dry.

    With prompt_len 24 (block size 4, 9 blocks, budget 16, threshold 8, caching on), the low-priority
    request is the victim at step 2 while it is the one being scheduled (it preempts itself); the important
    request after it must still be scheduled in that step. undo_victim_workload is the same with a third
    request, so the victim is one already scheduled in the step.
    """
    config = {
        "block_size": 4,
        "num_gpu_blocks": 9,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 3,
        "long_prefill_token_threshold": 8,
        "enable_chunked_prefill": True,
        "scheduling_policy": "priority",
        "enable_prefix_caching": True,
        "max_model_len": 64,
    }
    specs = [
        {"id": "r0", "prompt": [1 + j % 30 for j in range(prompt_len)], "max_tokens": 4, "arrive": 0,
         "arrival_time": 0.0, "priority": 2},
        {"id": "r1", "prompt": [31 + j for j in range(8)], "max_tokens": 4, "arrive": 1, "arrival_time": 1.0,
         "priority": 0},
    ]
    return config, specs


def undo_victim_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """lone_then_priority_workload(24) with a one-token request at step 0, so r0 is never alone and its
    prompt goes in chunks of 8: at step 2 r0 is scheduled its last chunk (two new blocks, cached at
    allocation), then r1 needs a block and r0, the victim, is undone. r1 takes one of the two blocks; the
    other was never written and must not stay a prefix-cache hit (r0 itself would read it when it comes
    back)."""
    config, specs = lone_then_priority_workload(24)
    specs.append({"id": "r2", "prompt": [50], "max_tokens": 1, "arrive": 0, "arrival_time": 0.5, "priority": 1})
    return config, specs


def undo_victim_then_chunk_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """undo_victim_workload with a shorter r1 and a 12-token r3 (priority 1) behind it in `running`: after
    r0 is undone at step 2, r3's chunk needs the 8 tokens of budget r0 handed back."""
    config, specs = undo_victim_workload()
    specs[1]["prompt"] = [31, 32, 33, 34]
    specs.append({"id": "r3", "prompt": [60 + j for j in range(12)], "max_tokens": 3, "arrive": 1,
                  "arrival_time": 1.5, "priority": 1})
    return config, specs


def unchunked_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """enable_chunked_prefill=False: a waiting prompt that does not fit the budget LEFT this step waits
    whole (vLLM breaks out of the waiting loop); it is never cut into a chunk."""
    config = {
        "block_size": 4,
        "num_gpu_blocks": 12,
        "max_num_batched_tokens": 8,
        "max_num_seqs": 4,
        "long_prefill_token_threshold": 0,
        "enable_chunked_prefill": False,
        "scheduling_policy": "fcfs",
        "enable_prefix_caching": False,
        "max_model_len": 8,
    }
    specs = [  # step 0: r0 takes 5 of 8 tokens, r1 (6) does not fit the 3 left, so r1 and r2 wait
        {"id": "r0", "prompt": [11, 12, 13, 14, 15], "max_tokens": 3, "arrive": 0, "arrival_time": 0.0,
         "priority": 0},
        {"id": "r1", "prompt": [21, 22, 23, 24, 25, 26], "max_tokens": 2, "arrive": 0, "arrival_time": 0.0,
         "priority": 0},
        {"id": "r2", "prompt": [31, 32, 33], "max_tokens": 4, "arrive": 0, "arrival_time": 0.0, "priority": 0},
        {"id": "r3", "prompt": [41, 42, 43, 44, 45, 46, 47], "max_tokens": 1, "arrive": 2,
         "arrival_time": 1.0, "priority": 0},
    ]
    return config, specs


def random_workload(seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8])
    config = {
        "block_size": block_size,
        "num_gpu_blocks": rng.randint(-(-24 // block_size) + 1, -(-64 // block_size) + 1),
        "max_num_batched_tokens": rng.choice([4, 8, 16, 32, 64]),
        "max_num_seqs": rng.randint(1, 5),
        "long_prefill_token_threshold": rng.choice([0, 0, rng.randint(1, 12)]),
        "enable_chunked_prefill": rng.random() < 0.8,
        "scheduling_policy": rng.choice(["fcfs", "priority"]),
        "enable_prefix_caching": rng.random() < 0.3,
        "max_model_len": rng.choice([24, 64]),
    }
    if not config["enable_chunked_prefill"]:  # as vLLM: without chunking a whole prompt must fit one step
        config["max_model_len"] = min(config["max_model_len"], config["max_num_batched_tokens"])
    shared = [rng.randrange(1, 40) for _ in range(12)]
    specs = []
    for i in range(rng.randint(1, 6)):
        length = rng.randint(1, 20)
        # a prompt leaves a position for the token it samples (< max_model_len)
        max_prompt = 23 if config["enable_chunked_prefill"] else min(23, config["max_num_batched_tokens"] - 1)
        length = min(length, max_prompt)
        prompt = shared[:length] if rng.random() < 0.4 else [rng.randrange(1, 40) for _ in range(length)]
        specs.append(
            {
                "id": f"r{i}",
                "prompt": prompt,
                "max_tokens": rng.randint(1, 10),
                "arrive": rng.randint(0, 4),
                "arrival_time": float(rng.randint(0, 3)),
                "priority": rng.randint(0, 2),
            }
        )
    return config, specs


def run_schedule(
    schedule_fn: Callable | None, config: dict[str, Any], specs: list[dict[str, Any]], max_steps: int = 80
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Step a scheduler with `schedule_fn` as its schedule() (None: the reference) -> [(output, state)]."""
    scheduler = make_scheduler(config)
    schedule = scheduler.schedule if schedule_fn is None else types.MethodType(schedule_fn, scheduler)
    log = []
    for step in range(max_steps):
        _add_requests(scheduler, specs, step)
        if not scheduler.has_unfinished_requests() and all(spec["arrive"] <= step for spec in specs):
            break
        output = schedule()
        summary = summarize_output(output)
        core_outputs = scheduler.update_from_output(output, fake_model_output(scheduler, output))
        state = summarize_state(scheduler)
        state["outputs (request_id, new_token_ids, finish_reason, num_cached_tokens)"] = [
            (o.request_id, list(o.new_token_ids), o.finish_reason, o.num_cached_tokens) for o in core_outputs
        ]
        log.append((summary, state))
    return log


def check_schedule(schedule: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = [
        worked_workload(),
        lone_then_priority_workload(24),
        undo_victim_workload(),
        undo_victim_then_chunk_workload(),
        priority_workload(),
        priority_workload(enable_prefix_caching=True),
        unchunked_workload(),
        *(random_workload(seed) for seed in seeds),
    ]
    for config, specs in cases:
        inputs = {
            "config": config,
            "requests (prompt, max_tokens, arrives at step, arrival_time, priority)": [
                (s["id"], len(s["prompt"]), s["max_tokens"], s["arrive"], s["arrival_time"], s["priority"])
                for s in specs
            ],
        }
        expected = run_schedule(None, config, specs)
        with calling("schedule", inputs, expected=expected):
            got = run_schedule(schedule, config, specs)
        _compare_runs(inputs, expected, got)
    passed("check_schedule", len(cases))


def _ordered_keys(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    return [*want, *(key for key in have if key not in want)]


def _compare_runs(inputs: dict[str, Any], expected: list, got: list) -> None:
    """Fail at the FIRST step where the two runs part, naming that step and what differs."""
    for index in range(max(len(expected), len(got))):
        want = expected[index] if index < len(expected) else ({"(no step)": "the run had ended"}, {})
        have = got[index] if index < len(got) else ({"(no step)": "your run ended early"}, {})
        if want == have:
            continue
        step_inputs = {**inputs, "the runs agree up to": f"step {index - 1}" if index else "(they part at once)"}
        for key in _ordered_keys(want[0], have[0]):
            expect_equal(
                f"step {index} (the first where your run and the reference part): SchedulerOutput.{key}",
                step_inputs,
                want[0].get(key),
                have[0].get(key),
                _HINTS.get(key.split(" ")[0], _HINT),
            )
        for key in _ordered_keys(want[1], have[1]):
            expect_equal(
                f"step {index} (the first where your run and the reference part): after update_from_output, "
                f"scheduler {key}",
                step_inputs,
                want[1].get(key),
                have[1].get(key),
                _HINTS.get(key, _HINT),
            )


_HINT = (
    "RUNNING first, in order: num_tokens_to_schedule(...), allocate_slots, preempt "
    "select_preemption_victim(...) until it fits (a request may preempt itself: FCFS stops the running "
    "pass there, PRIORITY goes on with the next request); then, only if nobody was preempted, WAITING "
    "requests while budget and max_num_seqs allow (prefix hits first). long_prefill_token_threshold caps "
    "a request only when more than one request is running or waiting (self.get_request_counts()). "
    "Finally build the output with self._make_output(...) and advance num_computed_tokens"
)
_HINTS = {
    "preempted_req_ids": "preempt only when allocate_slots returns None; the victim goes back to waiting "
    "with "
    "num_computed_tokens = 0 (self._preempt does it all)",
    "new_reqs": "a waiting request is admitted only if no one was preempted this step, a seat is free "
    "(max_num_seqs), budget is left, and allocate_slots succeeds; it starts after its prefix hits",
    "num_scheduled_tokens": "running requests are served first, in order, each num_tokens_to_schedule(...) "
    "tokens; the budget shrinks as you go; a request alone (self.get_request_counts()) gets no "
    "long_prefill_token_threshold cap; under PRIORITY a request that preempted itself does not end the "
    "running pass",
    "prefix-cache stats (requests, queries, hits, preempted: requests, queries, hits)": "count a request's "
    "prefix-cache lookup once, when it is admitted (record_prefix_cache_stats after allocate_slots succeeds), "
    "not for every step it waits",
    "prefix-cached block ids": "a victim undone in the step that scheduled it got blocks that were cached at "
    "allocation but will never be written this step: a block that holds no KV must not stay a prefix-cache "
    "hit (see the helpers the exercise lists)",
}


PHASE = Phase("05_scheduler", (
    Exercise("num_tokens_to_schedule", check_num_tokens_to_schedule, points=2, grade_id="test-num-tokens", part="num_tokens_to_schedule"),
    Exercise("select_preemption_victim", check_select_preemption_victim, points=2, grade_id="test-victim", part="select_preemption_victim"),
    Exercise("schedule", check_schedule, points=5, grade_id="test-schedule", part="schedule"),
))
