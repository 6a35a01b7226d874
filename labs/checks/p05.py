"""Checks for phase 05 (the scheduler), against mini.core.sched.scheduler.

    check_num_tokens_to_schedule(num_tokens_to_schedule)
    check_select_preemption_victim(select_preemption_victim)
    check_schedule(schedule)

`check_schedule` is the capstone: it runs the same workload through two schedulers, one with the
reference `Scheduler.schedule` and one with the candidate bound as its `schedule` method, feeding both
the same fake model (the next token is a hash of the context), and compares every SchedulerOutput and
the scheduler state after every step. No model, no tensors: a few milliseconds per step.
On a mismatch it fails at the FIRST step where the two runs part, with both runs' decisions per step up to
there (running requests scheduled and their tokens, preemptions, admissions) and a hint naming the rule that
step exercises (`rule_hint`: admission after a preemption, the victim, self-preemption, undoing a victim, the
lone-request threshold, prefix hits, resumed requests, seats, chunking). `expect_same_timeline` does the same
for the notebook's "Plug it in" cell on the real engine.

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

from labs.checks.common import calling, counterexample, expect_equal, passed
from labs.checks.grading import graded
from labs.checks.p02 import expect_same_tokens  # noqa: F401  (the plug cell imports it from here)
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


@graded
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


@graded
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
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Step a scheduler with `schedule_fn` as its schedule() (None: the reference) -> per step
    (output summary, state after update_from_output, context at the step's start). The first two are
    compared; the context (queues and token counts before the step) only helps name the rule that broke."""
    scheduler = make_scheduler(config)
    schedule = scheduler.schedule if schedule_fn is None else types.MethodType(schedule_fn, scheduler)
    log = []
    for step in range(max_steps):
        _add_requests(scheduler, specs, step)
        if not scheduler.has_unfinished_requests() and all(spec["arrive"] <= step for spec in specs):
            break
        context = {
            "running": [r.request_id for r in scheduler.running],
            "waiting": [r.request_id for r in scheduler.waiting],
            "resumed": [r.request_id for r in scheduler.waiting if r.num_output_tokens > 0],
        }
        output = schedule()
        summary = summarize_output(output)
        core_outputs = scheduler.update_from_output(output, fake_model_output(scheduler, output))
        state = summarize_state(scheduler)
        state["outputs (request_id, new_token_ids, finish_reason, num_cached_tokens)"] = [
            (o.request_id, list(o.new_token_ids), o.finish_reason, o.num_cached_tokens) for o in core_outputs
        ]
        log.append((summary, state, context))
    return log


@graded
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
        _compare_runs(inputs, config, expected, got)
    passed("check_schedule", len(cases))


def _ordered_keys(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    return [*want, *(key for key in have if key not in want)]


# ---- what each run decided, step by step
def decisions(summary: dict[str, Any]) -> dict[str, Any]:
    """One step's decisions: running requests scheduled (id -> tokens, in order), waiting requests admitted
    (id -> tokens), requests preempted."""
    if "(no step)" in summary:
        return {"ran": {}, "admitted": {}, "preempted": [], "hits": {}, "ended": True}
    counts = dict(summary["num_scheduled_tokens"])
    new_reqs = summary["new_reqs (req_id, block_ids, num_computed_tokens)"]
    admitted = [req_id for req_id, _, _ in new_reqs]
    return {
        "hits": {req_id: num_computed for req_id, _, num_computed in new_reqs},
        "ran": {r: n for r, n in counts.items() if r not in admitted},
        "admitted": {r: counts.get(r, 0) for r in admitted},
        "preempted": list(summary["preempted_req_ids"]),
        "ended": False,
    }


def describe_decisions(step: dict[str, Any]) -> str:
    if step["ended"]:
        return "(the run had ended)"
    parts = []
    if step["ran"]:
        parts.append("ran " + ", ".join(f"{r} {n}" for r, n in step["ran"].items()))
    if step["preempted"]:
        parts.append("preempted " + ", ".join(step["preempted"]))
    if step["admitted"]:
        parts.append("admitted " + ", ".join(f"{r} {n}" for r, n in step["admitted"].items()))
    return "; ".join(parts) or "nothing scheduled"


def decision_table(expected: list, got: list, upto: int) -> str:
    """Both runs' decisions for steps 0..upto, side by side (the last row is the first that differs)."""
    rows = []
    for index in range(upto + 1):
        want = describe_decisions(decisions(expected[index][0] if index < len(expected) else {"(no step)": 1}))
        have = describe_decisions(decisions(got[index][0] if index < len(got) else {"(no step)": 1}))
        rows.append((index, want, have))
    first = max(len("reference"), *(len(w) for _, w, _ in rows))
    lines = [f"    step  {'reference':<{first}}  | yours"]
    for index, want, have in rows[-12:]:
        mark = "  <- first difference" if index == upto else ""
        lines.append(f"    {index:>4}  {want:<{first}}  | {have}{mark}")
    if len(rows) > 12:
        lines.insert(1, f"    ... steps 0-{len(rows) - 13} agree ...")
    return "\n".join(lines)


def _compare_runs(inputs: dict[str, Any], config: dict[str, Any], expected: list, got: list) -> None:
    """Fail at the FIRST step where the two runs part: both runs' decisions up to there, the first field that
    differs, and a hint naming the rule that step exercises."""
    __tracebackhide__ = True
    for index in range(max(len(expected), len(got))):
        want = expected[index][:2] if index < len(expected) else ({"(no step)": "the run had ended"}, {})
        have = got[index][:2] if index < len(got) else ({"(no step)": "your run ended early"}, {})
        if want == have:
            continue
        context = expected[index][2] if index < len(expected) else got[index][2]
        where = f"step {index} (the first where your run and the reference part): "
        fields = [(f"SchedulerOutput.{key}", want[0].get(key), have[0].get(key), key)
                  for key in _ordered_keys(want[0], have[0])]
        fields += [(f"after update_from_output, scheduler {key}", want[1].get(key), have[1].get(key), key)
                   for key in _ordered_keys(want[1], have[1])]
        what, expected_value, got_value, key = next(f for f in fields if f[1] != f[2])
        hint = rule_hint(config, context, decisions(want[0]), decisions(have[0]), key)
        message = counterexample(where + what, {**inputs, "the runs agree up to": (
            f"step {index - 1}" if index else "(they part at once)")}, expected_value, got_value, hint)
        table = decision_table(expected, got, index)
        raise AssertionError(f"{message}\n  decisions per step (ran = running requests scheduled, with their "
                             f"tokens; admitted = waiting requests started):\n{table}") from None


# ---- hints: the rule the first differing step exercises
RULE_NO_ADMIT = (
    "no admission after a preemption: in a step that preempted anyone, no waiting request is admitted "
    "(memory is evidently tight); the waiting pass runs only when nobody was preempted")
RULE_PREEMPT_ONLY_WHEN_FULL = (
    "preempt only when allocate_slots returns None (the pool cannot hold this request's new tokens), and only "
    "as many victims as it takes to fit")
RULE_MUST_PREEMPT = (
    "when allocate_slots returns None, preempt self.select_preemption_victim(self.running, self.policy) "
    "(self._preempt) and retry, until it fits or the request itself was the victim")
RULE_VICTIM = (
    "the victim is self.select_preemption_victim(self.running, self.policy), chosen again before every retry "
    "from the CURRENT running list; a victim already scheduled in this step leaves the step")
RULE_SELF_PRIORITY = (
    "a request that preempts itself: under FCFS it was the last running request and the running pass ends; "
    "under PRIORITY the pass goes on with the next running request (more important ones may fit now)")
RULE_UNDO_VICTIM = (
    "a victim already scheduled in this step (PRIORITY) is undone: it leaves the step's scheduled requests, "
    "its tokens go back to the token budget, its new block ids are dropped")
RULE_LONE = (
    "a lone request has nobody to starve: when at most one request is running or waiting at the start of the "
    "step (self.get_request_counts()), long_prefill_token_threshold does not apply (threshold 0)")
RULE_THRESHOLD = (
    "long_prefill_token_threshold caps every request's tokens in a step when more than one request is running "
    "or waiting (self.get_request_counts())")
RULE_RUNNING_FIRST = (
    "running requests are served first, in their order in self.running, each num_tokens_to_schedule(...) "
    "tokens from the budget LEFT; waiting requests get what remains")
RULE_SEATS = (
    "admit waiting requests in queue order while budget is left and len(self.running) < max_num_seqs; if the "
    "head does not fit (0 tokens, or allocate_slots returns None), stop: the head is never skipped")
RULE_UNCHUNKED = (
    "without chunked prefill a waiting prompt (minus its prefix hits) that does not fit the budget LEFT waits "
    "whole: stop admitting; it is never cut into a chunk")
RULE_PREFIX_HITS = (
    "a waiting request starts after its prefix-cache hits: get_computed_blocks(request) -> (blocks, "
    "num_hits); it computes num_tokens - num_hits and starts with num_computed_tokens = num_hits")
RULE_RESUMED = (
    "a request wants num_tokens - num_computed_tokens, where num_tokens counts the prompt AND its outputs: a "
    "request resumed after a preemption recomputes both")
RULE_ADVANCE = (
    "after building the output, advance each scheduled request's num_computed_tokens by its tokens (the next "
    "schedule() may be planned before this step's outputs arrive)")
_HINTS = {
    "prefix-cache stats (requests, queries, hits, preempted: requests, queries, hits)": "count a request's "
    "prefix-cache lookup once, when it is admitted (record_prefix_cache_stats after allocate_slots succeeds), "
    "not for every step it waits",
    "prefix-cached block ids": "a victim undone in the step that scheduled it got blocks that were cached at "
    "allocation but will never be written this step: a block that holds no KV must not stay a prefix-cache "
    "hit (see the helpers the exercise lists)",
    "num_computed_tokens": RULE_ADVANCE,
}
_HINT = (
    "running first, in order (num_tokens_to_schedule, allocate_slots, preempt until it fits); then, only if "
    "nobody was preempted, waiting requests while budget and max_num_seqs allow (prefix hits first); finally "
    "self._make_output(...) and advance num_computed_tokens")


def rule_hint(config: dict[str, Any], context: dict[str, Any], want: dict[str, Any], have: dict[str, Any],
              key: str) -> str:
    """The rule the first differing step exercises, from the two runs' decisions at that step (and the
    reference's queues at its start); `key` is the first differing field."""
    rule = _classify(config, context, want, have)
    if rule is None:
        rule = _HINTS.get(key, _HINTS.get(key.split(" ")[0], _HINT))
    return "RULE: " + rule


def _classify(config: dict[str, Any], context: dict[str, Any], want: dict[str, Any],
              have: dict[str, Any]) -> str | None:
    if want["ended"] or have["ended"]:
        return None
    if have["preempted"] and have["admitted"]:
        return RULE_NO_ADMIT
    if want["preempted"] != have["preempted"]:
        if not want["preempted"]:
            return RULE_PREEMPT_ONLY_WHEN_FULL
        if not have["preempted"]:
            return RULE_MUST_PREEMPT
        if config["scheduling_policy"] == "priority":
            self_victims = [r for r in want["preempted"] if r in context["running"] and r not in want["ran"]]
            if self_victims and set(have["preempted"]) < set(want["preempted"]):
                return RULE_SELF_PRIORITY
        return RULE_VICTIM
    if want["preempted"]:
        undone = [r for r in want["preempted"] if r in have["ran"]]
        if undone:
            return RULE_UNDO_VICTIM
        if config["scheduling_policy"] == "priority":
            later = [r for r in want["ran"] if r not in have["ran"]]
            if later:
                return RULE_SELF_PRIORITY
            if sum(have["ran"].values()) < sum(want["ran"].values()):
                return RULE_UNDO_VICTIM
    threshold = config["long_prefill_token_threshold"] if config["enable_chunked_prefill"] else 0
    lone = len(context["running"]) + len(context["waiting"]) <= 1
    want_counts = {**want["ran"], **want["admitted"]}
    have_counts = {**have["ran"], **have["admitted"]}
    for req_id in want_counts.keys() & have_counts.keys():
        if want_counts[req_id] != have_counts[req_id] and threshold:
            if lone and have_counts[req_id] == threshold < want_counts[req_id]:
                return RULE_LONE
            if not lone and have_counts[req_id] > threshold >= want_counts[req_id]:
                return RULE_THRESHOLD
    if list(want["ran"]) != list(have["ran"]):
        return RULE_RUNNING_FIRST
    for req_id, count in want["ran"].items():
        if have["ran"][req_id] != count:
            return RULE_RESUMED if have["ran"][req_id] < count else RULE_RUNNING_FIRST
    if want["admitted"] != have["admitted"]:
        extra = [r for r in have["admitted"] if r not in want["admitted"]]
        if extra and not config["enable_chunked_prefill"]:
            return RULE_UNCHUNKED
        differing = [r for r in {*want["admitted"], *have["admitted"]}
                     if want["admitted"].get(r) != have["admitted"].get(r)]
        if any(r in have["hits"] and want["hits"].get(r) != have["hits"][r] for r in want["hits"]):
            return RULE_PREFIX_HITS
        if any(r in context["resumed"] for r in differing):
            return f"{RULE_PREFIX_HITS}. And {RULE_RESUMED}" if config["enable_prefix_caching"] else RULE_RESUMED
        if any(want["hits"].values()):
            return RULE_PREFIX_HITS
        return RULE_SEATS
    return None


# ---- "Plug it in": the engine's timeline and tokens against the reference's, with what differed
def expect_same_timeline(mine: Any, reference_timeline: Any) -> None:
    """Raise at the first engine step where your scheduler's timeline differs from the reference's."""
    __tracebackhide__ = True
    for index in range(max(len(mine.steps), len(reference_timeline.steps))):
        want = reference_timeline.steps[index] if index < len(reference_timeline.steps) else None
        have = mine.steps[index] if index < len(mine.steps) else None
        if want is None or have is None:
            raise AssertionError(
                f"the engine with your scheduler ran {len(mine.steps)} steps, the reference "
                f"{len(reference_timeline.steps)}: they part at step {index + 1}") from None
        for what in ("num_scheduled_tokens", "preempted", "finished"):
            expected, got = getattr(want, what), getattr(have, what)
            if expected != got:
                requests = sorted(set(expected) ^ set(got) or {r for r in expected if expected[r] != got.get(r)})
                raise AssertionError(
                    f"engine step {want.step}: {what} differs (request(s) {requests}); expected {expected}, "
                    f"got {got}. Steps 1..{want.step - 1} agree; run check_schedule(schedule) for the rule") \
                    from None


PHASE = Phase("05_scheduler", (
    Exercise("num_tokens_to_schedule", check_num_tokens_to_schedule, points=2, grade_id="test-num-tokens", part="num_tokens_to_schedule"),
    Exercise("select_preemption_victim", check_select_preemption_victim, points=2, grade_id="test-victim", part="select_preemption_victim"),
    Exercise("schedule", check_schedule, points=8, grade_id="test-schedule", part="schedule"),
))
