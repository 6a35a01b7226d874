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

Speculative decoding is among the workloads (fixed and random, n-gram drafts and a fake drafter with its own KV
cache): the fake model then verifies the scheduled drafts greedily and proposes the next ones, and the runs compare
`scheduled_spec_decode_tokens`, the lookahead blocks and the drafts left for the next step. A candidate that raises
is first compared on the steps it completed, so the first wrong step is reported rather than a later crash.

The worked example of the phase: block_size 4, 12 KV blocks (11 usable: 44 token slots), a budget of
16 tokens per step, max_num_seqs 3, long_prefill_token_threshold 8, and six requests.

vLLM v0.33.0 (vllm/v1/core/sched/scheduler.py) is the authority for every rule graded here: the length
cap keeps a position for the sampled token (`max_model_len - num_computed_tokens - 1`), the priority
victim is `max(running, key=(priority, arrival_time))` (the first such on a tie), a request alone gets
no `long_prefill_token_threshold` cap, and a request that preempts itself under the priority policy lets
the running pass go on. tests/course/vllm_answers/test_p05.py runs vLLM's own victim choice and token
count through these checks. mini's own rule on top (vLLM frees them cached): blocks allocated this step to
a victim undone later in the same step are taken out of the prefix cache (`uncache_uncomputed_blocks`).
"""

from __future__ import annotations

import hashlib
import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import (  # expect_same_tokens: the plug cell imports it from here
    calling,
    counterexample,
    expect_equal,
    expect_same_tokens,  # noqa: F401
    passed,
)
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request
from mini.core.sched import scheduler as reference
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.request_queue import SchedulingPolicy
from mini.runner_outputs import ModelRunnerOutput
from mini.sampling_params import SamplingParams
from mini.spec_decode.ngram_proposer import propose_ngram

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


def fake_drafts(context: list[int], k: int) -> list[int]:
    """A fake drafter with its own KV cache (the "draft_model" method): k guesses, each one what the fake model
    says next about three times in four (a hash decides), so drafts are accepted, partly accepted or rejected."""
    drafts: list[int] = []
    context = list(context)
    for _ in range(k):
        right = next_token(context)
        coin = hashlib.blake2b(repr(("draft", context)).encode(), digest_size=2).digest()[0] % 4
        token = right if coin else (right + 1) % VOCAB_SIZE
        drafts.append(token)
        context.append(token)
    return drafts


def propose_drafts(scheduler: reference.Scheduler, token_ids: list[int]) -> list[int]:
    """The drafts proposed after a step, for the request whose tokens are now `token_ids`: prompt lookup
    (n-gram, mini.spec_decode.ngram_proposer) or the fake drafter with a KV cache."""
    spec = scheduler.config.speculative_config
    if spec.method == "ngram":
        return propose_ngram(token_ids, spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens,
                             scheduler.max_request_len)
    return fake_drafts(token_ids, spec.num_speculative_tokens)


def fake_model_output(scheduler: reference.Scheduler, output: Any) -> ModelRunnerOutput:
    """What a model runner would return for `output`, with the fake model (the next token is a hash of the context).

    A request whose known tokens are now all computed samples; one still in the middle of its prompt samples
    nothing ([]). With speculative decoding the step verifies the request's scheduled drafts greedily (each
    accepted while it is what the fake model says; the first that is not is replaced by the model's token, and
    all accepted earn a bonus token), and drafts for the next step are proposed after every sampling step.
    """
    req_ids = list(output.num_scheduled_tokens)
    speculative = scheduler.config.speculative_config is not None
    sampled, proposals = [], []
    for req_id in req_ids:
        request = scheduler.requests.get(req_id)
        if request is None or request.num_computed_tokens < request.num_tokens:
            sampled.append([])
            proposals.append([])
            continue
        context = list(request.all_token_ids)
        emitted = []
        for draft in [*(output.scheduled_spec_decode_tokens or {}).get(req_id, []), None]:
            target = next_token(context)
            emitted.append(target)
            context.append(target)
            if draft != target:
                break
        sampled.append(emitted)
        proposals.append(propose_drafts(scheduler, context) if speculative else [])
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled,
                             spec_token_ids=proposals if speculative else None)


def summarize_output(output: Any) -> dict[str, Any]:
    cached = output.scheduled_cached_reqs
    return {
        "num_scheduled_tokens": list(output.num_scheduled_tokens.items()),
        "new_reqs (req_id, block_ids, num_computed_tokens)": [
            (r.req_id, list(r.block_ids), r.num_computed_tokens) for r in output.scheduled_new_reqs
        ],
        "cached_reqs (req_id, new_block_ids, num_computed_tokens)": list(
            zip(cached.req_ids, [list(b) for b in cached.new_block_ids], cached.num_computed_tokens, strict=False)
        ),
        "preempted_req_ids": sorted(output.preempted_req_ids),
        "finished_req_ids": sorted(output.finished_req_ids),
        "partial_prefill_req_ids": sorted(output.partial_prefill_req_ids),
        "total_num_scheduled_tokens": output.total_num_scheduled_tokens,
        "scheduled_spec_decode_tokens": sorted((req_id, list(drafts)) for req_id, drafts in
                                               (output.scheduled_spec_decode_tokens or {}).items()),
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


def random_spec_workload(seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A random workload with speculative decoding: prompt lookup (n-gram, from the request's own tokens: the
    prompts repeat a few tokens so it finds matches) or a drafter with its own KV cache (the fake drafter:
    k lookahead slots per allocation that reaches the known tokens' end)."""
    rng = random.Random(10_000 + seed)
    block_size = rng.choice([1, 2, 4])
    method = rng.choice(["ngram", "draft_model"])
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": rng.randint(1, 4)}
    if method == "ngram":
        spec.update(prompt_lookup_min=1, prompt_lookup_max=rng.randint(1, 3))
    config = {
        "block_size": block_size,
        "num_gpu_blocks": rng.randint(-(-28 // block_size) + 1, -(-64 // block_size) + 1),
        "max_num_batched_tokens": rng.choice([4, 6, 8, 16]),
        "max_num_seqs": rng.randint(1, 4),
        "long_prefill_token_threshold": rng.choice([0, 0, rng.randint(1, 8)]),
        "enable_chunked_prefill": rng.random() < 0.85,
        "scheduling_policy": rng.choice(["fcfs", "priority"]),
        "enable_prefix_caching": rng.random() < 0.3,
        "max_model_len": rng.choice([16, 24, 64]),
        "speculative_config": spec,
    }
    if not config["enable_chunked_prefill"]:
        config["max_model_len"] = min(config["max_model_len"], config["max_num_batched_tokens"])
    alphabet = [rng.randrange(1, VOCAB_SIZE) for _ in range(rng.randint(2, 6))]
    specs = []
    for i in range(rng.randint(1, 5)):
        length = min(rng.randint(1, 16), config["max_model_len"] - 1)
        specs.append({"id": f"r{i}", "prompt": [rng.choice(alphabet) for _ in range(length)],
                      "max_tokens": rng.randint(1, 12), "arrive": rng.randint(0, 4),
                      "arrival_time": float(rng.randint(0, 3)), "priority": rng.randint(0, 2)})
    return config, specs


def spec_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Speculative decoding with a drafter that has its own KV cache (k = 3 drafts, 3 lookahead slots), FCFS.

    Budget 6: two decoding requests each want their last token and 3 drafts (4), so the second one verifies only
    the drafts that fit; near max_model_len (16) the length cap trims the drafts and the lookahead slots too."""
    config = {"block_size": 4, "num_gpu_blocks": 12, "max_num_batched_tokens": 6, "max_num_seqs": 2,
              "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "scheduling_policy": "fcfs",
              "enable_prefix_caching": False, "max_model_len": 16,
              "speculative_config": {"method": "draft_model", "num_speculative_tokens": 3}}
    specs = [
        {"id": "r0", "prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 12, "arrive": 0, "arrival_time": 0.0,
         "priority": 0},
        {"id": "r1", "prompt": [21, 22, 23, 24], "max_tokens": 6, "arrive": 0, "arrival_time": 1.0, "priority": 0},
    ]
    return config, specs


def spec_undo_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Priority policy with drafts (k = 2, a drafter with a KV cache): at step 2 low-priority r0 is scheduled its
    last token and 2 drafts, then important r1 finds no block; r0, the victim, is undone with its drafts."""
    config = {"block_size": 4, "num_gpu_blocks": 7, "max_num_batched_tokens": 8, "max_num_seqs": 2,
              "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "scheduling_policy": "priority",
              "enable_prefix_caching": False, "max_model_len": 16,
              "speculative_config": {"method": "draft_model", "num_speculative_tokens": 2}}
    specs = [
        {"id": "r0", "prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 8, "arrive": 0, "arrival_time": 0.0,
         "priority": 1},
        {"id": "r1", "prompt": [31, 32, 33, 34], "max_tokens": 6, "arrive": 1, "arrival_time": 1.0, "priority": 0},
    ]
    return config, specs


def ngram_workload() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Speculative decoding by prompt lookup (n-gram, k = 3, no KV cache of its own: no lookahead slots): drafts
    come and go with what the request's own tokens repeat."""
    config = {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 8, "max_num_seqs": 3,
              "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "scheduling_policy": "fcfs",
              "enable_prefix_caching": False, "max_model_len": 40,
              "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                     "prompt_lookup_max": 3}}
    specs = [
        {"id": "r0", "prompt": list(range(1, 13)), "max_tokens": 8, "arrive": 0, "arrival_time": 0.0, "priority": 0},
        {"id": "r1", "prompt": list(range(20, 30)), "max_tokens": 6, "arrive": 0, "arrival_time": 1.0, "priority": 0},
        {"id": "r2", "prompt": list(range(30, 36)), "max_tokens": 5, "arrive": 2, "arrival_time": 2.0, "priority": 0},
    ]
    return config, specs


def run_schedule(
    schedule_fn: Callable | None, config: dict[str, Any], specs: list[dict[str, Any]], max_steps: int = 80,
    log: list | None = None,
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Step a scheduler with `schedule_fn` as its schedule() (None: the reference) -> per step
    (output summary, state after update_from_output, context at the step's start). The first two are
    compared; the context (queues and token counts before the step) only helps name the rule that broke.
    Steps are appended to `log` (when given) as they run, so a run that raises keeps the steps before."""
    scheduler = make_scheduler(config)
    schedule = scheduler.schedule if schedule_fn is None else types.MethodType(schedule_fn, scheduler)
    speculative = config.get("speculative_config") is not None
    log = [] if log is None else log
    for step in range(max_steps):
        _add_requests(scheduler, specs, step)
        if not scheduler.has_unfinished_requests() and all(spec["arrive"] <= step for spec in specs):
            break
        context = {
            "running": [r.request_id for r in scheduler.running],
            "waiting": [r.request_id for r in scheduler.waiting],
            "resumed": [r.request_id for r in scheduler.waiting if r.num_output_tokens > 0],
            "drafts": {r.request_id: list(r.spec_token_ids) for r in scheduler.running if r.spec_token_ids},
        }
        output = schedule()
        if not isinstance(output, SchedulerOutput):
            raise TypeError(f"schedule() must return the step's SchedulerOutput (built by self._make_output), got "
                            f"{type(output).__name__}")
        summary = summarize_output(output)
        core_outputs = scheduler.update_from_output(output, fake_model_output(scheduler, output))
        state = summarize_state(scheduler)
        state["outputs (request_id, new_token_ids, finish_reason, num_cached_tokens)"] = [
            (o.request_id, list(o.new_token_ids), o.finish_reason, o.num_cached_tokens) for o in core_outputs
        ]
        if speculative:
            state["drafts proposed for the next step (request_id -> spec_token_ids)"] = {
                r.request_id: list(r.spec_token_ids) for r in scheduler.running}
        log.append((summary, state, context))
    return log


@graded
def check_schedule(schedule: Callable, seeds: Iterable[int] = range(30)) -> None:
    seeds = list(seeds)
    cases = [
        worked_workload(),
        lone_then_priority_workload(24),
        undo_victim_workload(),
        undo_victim_then_chunk_workload(),
        priority_workload(),
        priority_workload(enable_prefix_caching=True),
        unchunked_workload(),
        ngram_workload(),
        spec_workload(),
        spec_undo_workload(),
        *(random_workload(seed) for seed in seeds),
        *(random_spec_workload(seed) for seed in seeds[: max(1, len(seeds) // 2)]),
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
        got: list = []
        try:
            run_schedule(schedule, config, specs, log=got)
        except Exception:  # reported below, after the steps that ran before it
            # The steps before the one that raised may already part from the reference: that is the bug to show.
            _compare_runs(inputs, config, expected[: len(got)], got)
            step = {"raised at step": len(got),
                    "the reference's decisions at that step": describe_decisions(decisions(expected[len(got)][0]))
                    if len(got) < len(expected) else "(the reference's run had ended)"}
            with calling("schedule", {**inputs, **step}, expected=step["the reference's decisions at that step"]):
                raise
        _compare_runs(inputs, config, expected, got)
    passed("check_schedule", len(cases))


def _ordered_keys(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    return [*want, *(key for key in have if key not in want)]


# ---- what each run decided, step by step
def decisions(summary: dict[str, Any]) -> dict[str, Any]:
    """One step's decisions: running requests scheduled (id -> tokens, in order), waiting requests admitted
    (id -> tokens), requests preempted, and the drafts each scheduled request verifies (id -> how many)."""
    if "(no step)" in summary:
        return {"ran": {}, "admitted": {}, "preempted": [], "hits": {}, "drafts": {}, "num_new_blocks": 0,
                "ended": True}
    counts = dict(summary["num_scheduled_tokens"])
    new_reqs = summary["new_reqs (req_id, block_ids, num_computed_tokens)"]
    admitted = [req_id for req_id, _, _ in new_reqs]
    return {
        "hits": {req_id: num_computed for req_id, _, num_computed in new_reqs},
        "ran": {r: n for r, n in counts.items() if r not in admitted},
        "admitted": {r: counts.get(r, 0) for r in admitted},
        "preempted": list(summary["preempted_req_ids"]),
        "drafts": {r: len(drafts) for r, drafts in summary.get("scheduled_spec_decode_tokens", [])},
        "num_new_blocks": sum(len(blocks) for _, blocks, _ in new_reqs) + sum(
            len(blocks) for _, blocks, _ in summary["cached_reqs (req_id, new_block_ids, num_computed_tokens)"]),
        "ended": False,
    }


def describe_decisions(step: dict[str, Any]) -> str:
    if step["ended"]:
        return "(the run had ended)"

    def tokens(req_id: str, count: int) -> str:
        num_drafts = step["drafts"].get(req_id, 0)
        return f"{req_id} {count}" + (f" ({num_drafts} draft{'s' if num_drafts > 1 else ''})" if num_drafts else "")

    parts = []
    if step["ran"]:
        parts.append("ran " + ", ".join(tokens(r, n) for r, n in step["ran"].items()))
    if step["preempted"]:
        parts.append("preempted " + ", ".join(step["preempted"]))
    if step["admitted"]:
        parts.append("admitted " + ", ".join(tokens(r, n) for r, n in step["admitted"].items()))
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
                             f"tokens; admitted = waiting requests started; (n drafts) = the drafts it verifies):"
                             f"\n{table}") from None


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
RULE_SPEC_WANTED = (
    "speculative decoding: a running request also wants its drafts computed (request.spec_token_ids: proposed "
    "after its last step, verified by this one), after its last known token; they count against the budget, the "
    "threshold and the length cap like any other token (request.num_tokens_with_spec counts them). A schedule that "
    "ignores them silently turns speculation off")
RULE_SPEC_DRAFTS = (
    "SchedulerOutput.scheduled_spec_decode_tokens names, per running request, the drafts this step computes (they "
    "are the last of its scheduled tokens): all of them when it got its last known token and every draft, only the "
    "first ones that fit when the budget or the length cap cut it short, none when its step ends before its last "
    "known token; set it on the output of self._make_output")
RULE_SPEC_UNDO = (
    "a victim undone in the step that scheduled it leaves the step with everything the step gave it: its tokens "
    "(back to the budget), its new blocks, and its drafts (out of scheduled_spec_decode_tokens)")
RULE_LOOKAHEAD = (
    "a drafter with its own KV cache (self.num_lookahead_tokens > 0) writes its drafts' keys and values right "
    "after a step that reaches the request's last known token, so that step's allocation also asks for room for "
    "them: up to self.num_lookahead_tokens more slots, never past self.max_request_len tokens in all; an allocation "
    "whose step ends inside the known tokens (a prefill chunk) asks for none (mini's rule), in both passes")
_BLOCK_KEYS = ("new_reqs (req_id, block_ids, num_computed_tokens)",
               "cached_reqs (req_id, new_block_ids, num_computed_tokens)", "block_ids", "num_free_blocks",
               "prefix-cached block ids")
_PREEMPTION_RULES = (RULE_PREEMPT_ONLY_WHEN_FULL, RULE_MUST_PREEMPT, RULE_VICTIM, RULE_SELF_PRIORITY,
                     RULE_UNDO_VICTIM, RULE_NO_ADMIT)
_HINTS = {
    "prefix-cache stats (requests, queries, hits, preempted: requests, queries, hits)": "count a request's "
    "prefix-cache lookup once, when it is admitted (record_prefix_cache_stats after allocate_slots succeeds), "
    "not for every step it waits",
    "prefix-cached block ids": "a victim undone in the step that scheduled it got blocks that were cached at "
    "allocation but will never be written this step: a block that holds no KV must not stay a prefix-cache "
    "hit (see the helpers the exercise lists)",
    "num_computed_tokens": RULE_ADVANCE,
    "finished_req_ids": "finished_req_ids tells the runner once which requests finished or were preempted since "
    "the last step (the scheduler collects them between steps): after building the output, start a new, empty set "
    "in self.finished_req_ids",
    "status": "a request admitted from the waiting queue is RUNNING from this step on (request.status)",
    "outputs": "a request's num_cached_tokens is its prefix-cache hits at its FIRST admission: set once, while it "
    "is still -1 (a request resumed after a preemption keeps the first value)",
    "scheduled_spec_decode_tokens": RULE_SPEC_DRAFTS,
    "drafts": RULE_SPEC_DRAFTS,
}
_HINT = (
    "running first, in order (num_tokens_to_schedule, allocate_slots, preempt until it fits); then, only if "
    "nobody was preempted, waiting requests while budget and max_num_seqs allow (prefix hits first); finally "
    "self._make_output(...) and advance num_computed_tokens")


def rule_hint(config: dict[str, Any], context: dict[str, Any], want: dict[str, Any], have: dict[str, Any],
              key: str) -> str:
    """The rule the first differing step exercises, from the two runs' decisions at that step (and the
    reference's queues at its start); `key` is the first differing field."""
    rule = _classify_spec(config, context, want, have, key) or _classify(config, context, want, have)
    if rule is not None and rule in _PREEMPTION_RULES and _has_lookahead(config):
        rule += f". (With speculative decoding, check the lookahead slots first: {RULE_LOOKAHEAD})"
    if rule is None:
        rule = _HINTS.get(key, _HINTS.get(key.split(" ")[0], _HINT))
    return "RULE: " + rule


def _has_lookahead(config: dict[str, Any]) -> bool:
    spec = config.get("speculative_config")
    return spec is not None and spec["method"] != "ngram"


def _classify_spec(config: dict[str, Any], context: dict[str, Any], want: dict[str, Any], have: dict[str, Any],
                   key: str) -> str | None:
    """The speculative-decoding rule a step breaks (None: not one of them)."""
    if config.get("speculative_config") is None or want["ended"] or have["ended"]:
        return None
    drafted = context.get("drafts", {})
    if want["preempted"] == have["preempted"]:
        for req_id, count in want["ran"].items():
            if req_id in drafted and have["ran"].get(req_id, count) < count and not have["drafts"].get(req_id):
                return RULE_SPEC_WANTED
    if want["drafts"] != have["drafts"] or key == "scheduled_spec_decode_tokens":
        if any(r in want["preempted"] and r not in want["drafts"] for r in have["drafts"]):
            return RULE_SPEC_UNDO
        if want["preempted"] == have["preempted"] and {**want["ran"], **want["admitted"]} == {
                **have["ran"], **have["admitted"]} or key == "scheduled_spec_decode_tokens":
            return RULE_SPEC_DRAFTS
        if any(have["ran"].get(r) == 1 for r in drafted if r in want["drafts"]):
            return RULE_SPEC_WANTED
    if (_has_lookahead(config) and key in _BLOCK_KEYS and want["preempted"] == have["preempted"]
            and {**want["ran"], **want["admitted"]} == {**have["ran"], **have["admitted"]}):
        if have["num_new_blocks"] > want["num_new_blocks"]:
            return RULE_LOOKAHEAD + ". Your step took MORE new blocks than the reference's for the same tokens"
        if have["num_new_blocks"] < want["num_new_blocks"]:
            return RULE_LOOKAHEAD + ". Your step took FEWER new blocks than the reference's for the same tokens"
        return RULE_LOOKAHEAD
    return None


def _classify(config: dict[str, Any], context: dict[str, Any], want: dict[str, Any],  # noqa: C901 - a case per mistake
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


def expect_same_spec_stats(mine: Any, reference_llm: Any) -> None:
    """Raise unless the engine `mine` (an LLM) verified and accepted as many drafts as `reference_llm`."""
    __tracebackhide__ = True
    want = reference_llm.llm_engine.get_scheduler_stats().spec_decoding_stats
    have = mine.llm_engine.get_scheduler_stats().spec_decoding_stats
    if (have.num_draft_tokens, have.num_accepted_tokens) != (want.num_draft_tokens, want.num_accepted_tokens):
        why = ("your schedule never hands the drafts (request.spec_token_ids) to the runner: the output is the same, "
               "but speculation is silently off" if have.num_draft_tokens == 0 else
               "the drafts your schedule hands to the runner are not the reference's")
        raise AssertionError(
            f"speculative decoding: {have.num_draft_tokens} draft tokens verified ({have.num_accepted_tokens} "
            f"accepted) with your scheduler, {want.num_draft_tokens} ({want.num_accepted_tokens}) with the "
            f"reference: {why}. Run check_schedule(schedule) for the first step and the rule") from None


PHASE = Phase("05_scheduler", (
    Exercise("num_tokens_to_schedule", check_num_tokens_to_schedule, points=2, grade_id="test-num-tokens",
             part="num_tokens_to_schedule"),
    Exercise("select_preemption_victim", check_select_preemption_victim, points=2, grade_id="test-victim",
             part="select_preemption_victim"),
    Exercise("schedule", check_schedule, points=8, grade_id="test-schedule", part="schedule",
             design="schedule() with speculative tokens: how drafts share the budget and the length limit, which "
                    "of them a step verifies, the lookahead slots a drafter with its own KV cache needs, and what an "
                    "undone victim hands back"),
))
