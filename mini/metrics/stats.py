"""Mirrors vllm/v1/metrics/stats.py: a snapshot of the scheduler after a step.

vLLM's `Scheduler.make_stats()` returns a `SchedulerStats` (running / waiting counts, KV-cache usage,
prefix-cache counters) that the engine hands to its stat loggers. mini's has the same counts plus the
state a teaching view draws: every request's block table and progress, the free-block queue in order
and each block's reference count. Views and tests read this, not the scheduler's internals.

`SpecDecodingStats` counts drafts and accepted drafts as vllm/v1/spec_decode/metrics.py does (same field
names), again as running totals.

`PrefixCacheStats` counts prefix-cache lookups as vLLM's does (`requests`, `queries` = tokens looked
up, `hits` = tokens found cached, once per request when the scheduler admits it; a request resumed after
a preemption counts in `preempted_requests` / `preempted_queries` / `preempted_hits` instead; `reset`
after `reset_prefix_cache()`). vLLM's scheduler hands over
the counts since its last `make_stats()` and the stat logger adds them up; mini's snapshot carries the
running totals instead (since the engine started or the cache was last reset), which is what a view
or a benchmark wants to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """The scheduler and its KV pool right after `schedule()` (or between steps)."""

    step: int                                   # schedule() calls so far
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float                       # fraction of usable blocks in use (0.0 - 1.0)
    num_preemptions: int                        # preemptions since the engine started
    running_req_ids: list[str] = field(default_factory=list)   # in scheduling order
    waiting_req_ids: list[str] = field(default_factory=list)   # queue order (preempted ones at the front)
    block_ids: dict[str, list[int]] = field(default_factory=dict)        # each unfinished request's blocks
    num_computed_tokens: dict[str, int] = field(default_factory=dict)    # each unfinished request's progress
    free_block_ids: list[int] = field(default_factory=list)    # free queue, head (evicted first) to tail
    block_ref_cnts: list[int] = field(default_factory=list)    # ref count of block 0, 1, ... (0 = free)
    num_gpu_blocks: int = 0                     # the null block included
    block_size: int = 0
    # Prefix caching (all empty / zero when it is off):
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)  # running totals
    block_hashes: list[bytes | None] = field(default_factory=list)   # hash of block 0, 1, ... (None = none)
    cached_block_ids: list[int] = field(default_factory=list)      # blocks a hit can resolve to now, sorted
    num_cached_tokens: dict[str, int] = field(default_factory=dict)  # each unfinished request's first hit
    request_block_hashes: dict[str, list[bytes]] = field(default_factory=dict)  # each one's full-block chain
    # Speculative decoding (zero when it is off): running totals.
    spec_decoding_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
