"""Mirrors vllm/v1/metrics/stats.py: the scheduler's counters after a step, for the stat loggers.

vLLM's scheduler (vllm/v1/core/sched/scheduler.py) builds a `SchedulerStats` after each step (running /
waiting counts, KV-cache usage, prefix-cache and speculative-decoding counters) that the engine hands to
its stat loggers. mini's holds
the same counters and nothing else (`LLMEngine.get_scheduler_stats()` builds one; it copies no block
table). What a teaching view draws (every request's block table, the free queue in order, each block's
reference count and hash) is a `PoolSnapshot`, taken only when a step observer asks for it
(mini/metrics/step_trace.py).

`SpecDecodingStats` counts drafts and accepted drafts as vllm/v1/spec_decode/metrics.py does (same field
names), again as running totals.

`PrefixCacheStats` counts prefix-cache lookups as vLLM's does (`requests`, `queries` = tokens looked
up, `hits` = tokens found cached, once per request when the scheduler admits it; a request resumed after
a preemption counts in `preempted_requests` / `preempted_queries` / `preempted_hits` instead; `reset`
after `reset_prefix_cache()`). vLLM's scheduler hands over the counts since it last built its stats and
the stat logger adds them up; mini's carry the running totals instead (since the engine started or the
cache was last reset), which is what a view or a benchmark wants to read.

`IterationStats` / `FinishedRequestStats` are what one step's outputs carried as they left the engine (token
counts, time to first token, inter-token and end-to-end latencies), counted by `record_output` as vLLM's
`IterationStats.update_from_output`; a `StatLogger` gets `(SchedulerStats, IterationStats)` after each step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mini.outputs import RequestOutput
from mini.sampling_params import RequestOutputKind


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups and hits, in tokens (vLLM: vllm/v1/metrics/stats.py, `PrefixCacheStats`)."""

    reset: bool = False     # the cache was reset (reset_prefix_cache) since these counts started
    requests: int = 0       # new requests admitted after a lookup (one each)
    queries: int = 0        # tokens looked up (their lengths)
    hits: int = 0           # tokens found in the cache
    preempted_requests: int = 0     # the same three for requests resumed after a preemption
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False) -> None:
        """Add one request's lookup (vLLM: `PrefixCacheStats.record`)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """hits / queries (0.0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class SpecDecodingStats:
    """Speculative decoding's counters (vLLM: vllm/v1/spec_decode/metrics.py, `SpecDecodingStats`).

    One *draft* is one request's run of proposed tokens verified in one step; `num_accepted_tokens_per_pos[i]`
    counts the drafts whose token at position i was accepted (so it never grows along the list).
    """

    num_spec_tokens: int = 0                 # k, the most drafts a request gets per step
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        self.num_spec_tokens = max(self.num_spec_tokens, num_draft_tokens)
        missing = self.num_spec_tokens - len(self.num_accepted_tokens_per_pos)
        self.num_accepted_tokens_per_pos.extend([0] * missing)
        for position in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[position] += 1

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / proposed draft tokens (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verified draft run: 1 (the target's own token) + accepted drafts, as vLLM logs
        it (1.0 before any draft: one token per pass, as without speculation)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


@dataclass(slots=True)
class SchedulerStats:
    """The scheduler's counters right after a step (or between steps): no per-block or per-request state."""

    step: int                                   # schedule() calls so far
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float                       # fraction of usable blocks in use (0.0 - 1.0)
    num_preemptions: int                        # preemptions since the engine started
    # Prefix caching (zero when it is off): running totals.
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    # Speculative decoding (zero when it is off): running totals.
    spec_decoding_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)

    @classmethod
    def from_scheduler(cls, scheduler: Any) -> SchedulerStats:
        """The counters of `scheduler` (a mini `Scheduler`) now: a few ints and two small copies."""
        manager = scheduler.kv_cache_manager
        spec = scheduler.spec_decoding_stats
        return cls(
            step=scheduler.step_index,
            num_running_reqs=len(scheduler.running),
            num_waiting_reqs=len(scheduler.waiting),
            kv_cache_usage=manager.block_pool.get_usage(),
            num_preemptions=scheduler.num_preemptions_total,
            prefix_cache_stats=dataclasses.replace(manager.prefix_cache_stats),
            spec_decoding_stats=dataclasses.replace(
                spec, num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos)),
        )


@dataclass(slots=True)
class PoolSnapshot:
    """A copy of the scheduler's queues and the KV pool, for views and tests (mini only: vLLM has none).

    Taken on demand (`LLMEngine.snapshot_pool()`, `StepTrace.snapshot()`): it copies every block's ref
    count and hash and every block table, so nothing on the serving path builds one.
    """

    running_req_ids: list[str]                  # in scheduling order
    waiting_req_ids: list[str]                  # queue order (preempted ones at the front)
    block_ids: dict[str, list[int]]             # each unfinished request's blocks
    num_computed_tokens: dict[str, int]         # each unfinished request's progress
    free_block_ids: list[int]                   # free queue, head (evicted first) to tail
    block_ref_cnts: list[int]                   # ref count of block 0, 1, ... (0 = free)
    num_gpu_blocks: int                         # the null block included
    block_size: int
    # Prefix caching (all empty when it is off):
    block_hashes: list[bytes | None] = field(default_factory=list)   # hash of block 0, 1, ... (None = none)
    cached_block_ids: list[int] = field(default_factory=list)      # blocks a hit can resolve to now, sorted
    num_cached_tokens: dict[str, int] = field(default_factory=dict)  # each unfinished request's first hit
    request_block_hashes: dict[str, list[bytes]] = field(default_factory=dict)  # each one's full-block chain

    @classmethod
    def from_scheduler(cls, scheduler: Any) -> PoolSnapshot:
        """Copy the queues of `scheduler` (a mini `Scheduler`) and its KV pool: O(blocks + table entries)."""
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        unfinished = [*scheduler.running, *scheduler.waiting]
        return cls(
            running_req_ids=[r.request_id for r in scheduler.running],
            waiting_req_ids=[r.request_id for r in scheduler.waiting],
            block_ids={r.request_id: manager.get_block_ids(r.request_id) for r in unfinished},
            num_computed_tokens={r.request_id: r.num_computed_tokens for r in unfinished},
            free_block_ids=pool.free_block_ids(),
            block_ref_cnts=[block.ref_cnt for block in pool.blocks],
            num_gpu_blocks=pool.num_gpu_blocks,
            block_size=manager.block_size,
            block_hashes=[block.block_hash for block in pool.blocks],
            cached_block_ids=[block.block_id for block in pool.cached_blocks()],
            num_cached_tokens={r.request_id: max(r.num_cached_tokens, 0) for r in unfinished},
            request_block_hashes={r.request_id: list(manager.req_to_block_hashes.get(r.request_id, []))
                                  for r in unfinished},
        )


@dataclass(slots=True)
class FinishedRequestStats:
    """One finished request (vLLM: FinishedRequestStats)."""

    request_id: str
    finish_reason: str | None
    e2e_latency_s: float
    num_prompt_tokens: int
    num_generation_tokens: int


@dataclass(slots=True)
class IterationStats:
    """What one engine step produced (vLLM: vllm/v1/metrics/stats.py IterationStats)."""

    num_prompt_tokens: int = 0             # prompts of requests that got their first token this step
    num_generation_tokens: int = 0
    time_to_first_tokens_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


@dataclass(slots=True)
class RequestTiming:
    """When a request arrived and what of it has left the engine (for its latencies)."""

    arrival_time: float
    output_kind: RequestOutputKind
    num_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None


StatLogger = Callable[[SchedulerStats, IterationStats], None]


def record_output(output: RequestOutput, timing: RequestTiming, now: float, iteration: IterationStats) -> None:
    """Count one output leaving the engine into this step's `IterationStats` (first-token, inter-token and
    end-to-end latencies, token counts), as vLLM's `IterationStats.update_from_output`."""
    produced = sum(len(c.token_ids) for c in output.outputs)
    new_tokens = produced if timing.output_kind == RequestOutputKind.DELTA else produced - timing.num_tokens
    if new_tokens > 0:
        if timing.first_token_time is None:
            timing.first_token_time = now
            iteration.time_to_first_tokens_s.append(now - timing.arrival_time)
            iteration.num_prompt_tokens += len(output.prompt_token_ids or [])
        else:
            iteration.inter_token_latencies_s.append(now - timing.last_token_time)
        timing.last_token_time = now
        timing.num_tokens += new_tokens
        iteration.num_generation_tokens += new_tokens
    if output.finished:
        reasons = {c.finish_reason for c in output.outputs}
        iteration.finished_requests.append(FinishedRequestStats(
            request_id=output.request_id, finish_reason=reasons.pop() if len(reasons) == 1 else "mixed",
            e2e_latency_s=now - timing.arrival_time, num_prompt_tokens=len(output.prompt_token_ids or []),
            num_generation_tokens=timing.num_tokens))
