"""GET /metrics: the engine's statistics in Prometheus' text format, through prometheus_client.

Mirrors vllm/v1/metrics/loggers.py (PrometheusStatLogger), with vLLM's metric names under the `mini:`
prefix instead of `vllm:`. `AsyncLLM` calls `record(scheduler_stats, iteration_stats)` from its engine
thread after every step; prometheus_client's metrics are thread-safe. Each logger owns its registry, so
two servers in one process (tests) do not collide.

    mini:num_requests_running / mini:num_requests_waiting    gauges
    mini:kv_cache_usage_perc                                  gauge, 0..1 (fraction of usable blocks in use)
    mini:prefix_cache_queries_total / _hits_total             counters, in tokens
    mini:num_preemptions_total                                counter
    mini:prompt_tokens_total / mini:generation_tokens_total   counters
    mini:request_success_total{finished_reason}               counter
    mini:time_to_first_token_seconds                          histogram
    mini:inter_token_latency_seconds                          histogram
    mini:e2e_request_latency_seconds                          histogram
    mini:spec_decode_num_drafts_total / _num_draft_tokens_total / _num_accepted_tokens_total   counters
    mini:spec_decode_num_accepted_tokens_per_pos_total{position}                              counter
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mini.engine.async_llm import IterationStats
from mini.metrics.stats import SchedulerStats

# Buckets as vLLM's (seconds), trimmed to the range a small engine lives in.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)


class PrometheusStatLogger:
    """A stat logger for AsyncLLM; `render()` is the /metrics body."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        self.running = gauge("mini:num_requests_running", "Requests in the running batch")
        self.waiting = gauge("mini:num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("mini:kv_cache_usage_perc", "KV-cache usage: fraction of usable blocks in use")
        self.prefix_queries = counter("mini:prefix_cache_queries", "Prefix-cache lookups, in tokens")
        self.prefix_hits = counter("mini:prefix_cache_hits", "Prefix-cache hits, in tokens")
        self.preemptions = counter("mini:num_preemptions", "Requests preempted")
        self.prompt_tokens = counter("mini:prompt_tokens", "Prompt tokens processed")
        self.generation_tokens = counter("mini:generation_tokens", "Tokens generated")
        self._success = Counter("mini:request_success", "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=reg)
        self.model_name = model_name
        self.ttft = histogram("mini:time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.itl = histogram("mini:inter_token_latency_seconds", "Time between two tokens", ITL_BUCKETS)
        self.e2e = histogram("mini:e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS)
        self._last_queries = self._last_hits = self._last_preemptions = 0
        # Speculative decoding (vLLM: vllm/v1/spec_decode/metrics.py SpecDecodingProm).
        self.spec_drafts = counter("mini:spec_decode_num_drafts", "Draft runs verified")
        self.spec_draft_tokens = counter("mini:spec_decode_num_draft_tokens", "Draft tokens verified")
        self.spec_accepted = counter("mini:spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self._spec_per_pos = Counter("mini:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft",
                                     ["model_name", "position"], registry=reg)
        self._last_spec = (0, 0, 0)
        self._last_spec_per_pos: list[int] = []

    def __call__(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        self.record(scheduler_stats, iteration_stats)

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        self.running.set(scheduler_stats.num_running_reqs)
        self.waiting.set(scheduler_stats.num_waiting_reqs)
        self.kv_usage.set(scheduler_stats.kv_cache_usage)
        # mini's snapshot carries running totals (reset with the cache): count only what is new.
        prefix = scheduler_stats.prefix_cache_stats
        if prefix.queries < self._last_queries:
            self._last_queries = self._last_hits = 0
        self.prefix_queries.inc(prefix.queries - self._last_queries)
        self.prefix_hits.inc(max(0, prefix.hits - self._last_hits))
        self._last_queries, self._last_hits = prefix.queries, prefix.hits
        self.preemptions.inc(max(0, scheduler_stats.num_preemptions - self._last_preemptions))
        self._last_preemptions = scheduler_stats.num_preemptions
        self._record_spec(scheduler_stats)
        self.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for value in iteration_stats.time_to_first_tokens_s:
            self.ttft.observe(value)
        for value in iteration_stats.inter_token_latencies_s:
            self.itl.observe(value)
        for finished in iteration_stats.finished_requests:
            self.e2e.observe(finished.e2e_latency_s)
            self._success.labels(self.model_name, str(finished.finish_reason)).inc()

    def _record_spec(self, scheduler_stats: SchedulerStats) -> None:
        spec = scheduler_stats.spec_decoding_stats
        drafts, draft_tokens, accepted = self._last_spec
        self.spec_drafts.inc(spec.num_drafts - drafts)
        self.spec_draft_tokens.inc(spec.num_draft_tokens - draft_tokens)
        self.spec_accepted.inc(spec.num_accepted_tokens - accepted)
        self._last_spec = (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)
        for position, count in enumerate(spec.num_accepted_tokens_per_pos):
            before = self._last_spec_per_pos[position] if position < len(self._last_spec_per_pos) else 0
            self._spec_per_pos.labels(self.model_name, str(position)).inc(count - before)
        self._last_spec_per_pos = list(spec.num_accepted_tokens_per_pos)

    def render(self) -> bytes:
        return generate_latest(self.registry)
