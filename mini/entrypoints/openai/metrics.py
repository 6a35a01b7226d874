"""GET /metrics: the engine's statistics in Prometheus' text format, through prometheus_client.

Mirrors vllm/v1/metrics/loggers.py (PrometheusStatLogger), with vLLM's metric names under the `mini:`
prefix instead of `vllm:`. `AsyncLLM` calls `record(scheduler_stats, iteration_stats)` after every step: from
its output-handler task, on the event loop in both modes; prometheus_client's metrics are thread-safe. Each
logger owns its registry, so two servers in one process (tests) do not collide.

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

Data parallelism (`--data-parallel-size N`, mini/engine/dp_client.py): every series also gets an `engine`
label, one series per engine core (vLLM labels by `engine` always; mini only when N > 1, so one engine's
series keep their names and labels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mini.engine.async_llm import IterationStats
from mini.metrics.stats import SchedulerStats

# Buckets as vLLM's (seconds), trimmed to the range a small engine lives in.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)


class _EngineSeries:
    """One engine core's labelled children of every metric, and the running totals seen so far."""

    def __init__(self, logger: PrometheusStatLogger, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.running = logger.running_family.labels(*labels)
        self.waiting = logger.waiting_family.labels(*labels)
        self.kv_usage = logger.kv_usage_family.labels(*labels)
        self.prefix_queries = logger.prefix_queries_family.labels(*labels)
        self.prefix_hits = logger.prefix_hits_family.labels(*labels)
        self.preemptions = logger.preemptions_family.labels(*labels)
        self.prompt_tokens = logger.prompt_tokens_family.labels(*labels)
        self.generation_tokens = logger.generation_tokens_family.labels(*labels)
        self.ttft = logger.ttft_family.labels(*labels)
        self.itl = logger.itl_family.labels(*labels)
        self.e2e = logger.e2e_family.labels(*labels)
        self.spec_drafts = logger.spec_drafts_family.labels(*labels)
        self.spec_draft_tokens = logger.spec_draft_tokens_family.labels(*labels)
        self.spec_accepted = logger.spec_accepted_family.labels(*labels)
        self.last_queries = self.last_hits = self.last_preemptions = 0
        self.last_spec = (0, 0, 0)
        self.last_spec_per_pos: list[int] = []


class PrometheusStatLogger:
    """A stat logger for AsyncLLM; `render()` is the /metrics body.

    `engine_indexes`: the data-parallel engine cores (vLLM's `engine_indexes`). With more than one, every
    series also carries an `engine` label ("0", "1", ...), one series per core, as vLLM's; with one, the
    labels stay `model_name` only. `record(..., engine_idx=i)` names the core a step came from;
    `engine_index_of`, when given, is asked instead (the in-process AsyncLLM calls loggers without it).
    """

    def __init__(self, model_name: str, engine_indexes: list[int] | None = None,
                 engine_index_of: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.engine_indexes = list(engine_indexes) if engine_indexes else [0]
        self.per_engine = len(self.engine_indexes) > 1
        self.engine_index_of = engine_index_of
        labels = ["model_name", "engine"] if self.per_engine else ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)

        self.running_family = gauge("mini:num_requests_running", "Requests in the running batch")
        self.waiting_family = gauge("mini:num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage_family = gauge("mini:kv_cache_usage_perc", "KV-cache usage: fraction of usable blocks in use")
        self.prefix_queries_family = counter("mini:prefix_cache_queries", "Prefix-cache lookups, in tokens")
        self.prefix_hits_family = counter("mini:prefix_cache_hits", "Prefix-cache hits, in tokens")
        self.preemptions_family = counter("mini:num_preemptions", "Requests preempted")
        self.prompt_tokens_family = counter("mini:prompt_tokens", "Prompt tokens processed")
        self.generation_tokens_family = counter("mini:generation_tokens", "Tokens generated")
        self._success = Counter("mini:request_success", "Finished requests by finish reason",
                                [*labels, "finished_reason"], registry=reg)
        self.model_name = model_name
        self.ttft_family = histogram("mini:time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.itl_family = histogram("mini:inter_token_latency_seconds", "Time between two tokens", ITL_BUCKETS)
        self.e2e_family = histogram("mini:e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS)
        # Speculative decoding (vLLM: vllm/v1/spec_decode/metrics.py SpecDecodingProm).
        self.spec_drafts_family = counter("mini:spec_decode_num_drafts", "Draft runs verified")
        self.spec_draft_tokens_family = counter("mini:spec_decode_num_draft_tokens", "Draft tokens verified")
        self.spec_accepted_family = counter("mini:spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self._spec_per_pos = Counter("mini:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft",
                                     [*labels, "position"], registry=reg)
        self.series = {index: _EngineSeries(self, (model_name, str(index)) if self.per_engine else (model_name,))
                       for index in self.engine_indexes}
        # The single engine's series under their old names (mini's tests and views read these).
        first = self.series[self.engine_indexes[0]]
        self.running, self.waiting, self.kv_usage = first.running, first.waiting, first.kv_usage
        self.prefix_queries, self.prefix_hits, self.preemptions = (first.prefix_queries, first.prefix_hits,
                                                                   first.preemptions)
        self.prompt_tokens, self.generation_tokens = first.prompt_tokens, first.generation_tokens
        self.ttft, self.itl, self.e2e = first.ttft, first.itl, first.e2e
        self.spec_drafts, self.spec_draft_tokens, self.spec_accepted = (first.spec_drafts, first.spec_draft_tokens,
                                                                        first.spec_accepted)

    def __call__(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
                 engine_idx: int | None = None) -> None:
        self.record(scheduler_stats, iteration_stats, engine_idx)

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int | None = None) -> None:
        if engine_idx is None:
            engine_idx = self.engine_index_of() if self.engine_index_of is not None else self.engine_indexes[0]
        series = self.series.get(engine_idx)
        if series is None:
            raise ValueError(f"engine_idx {engine_idx!r} is not one of this logger's engines {self.engine_indexes}")
        series.running.set(scheduler_stats.num_running_reqs)
        series.waiting.set(scheduler_stats.num_waiting_reqs)
        series.kv_usage.set(scheduler_stats.kv_cache_usage)
        # mini's snapshot carries running totals (reset with the cache): count only what is new.
        prefix = scheduler_stats.prefix_cache_stats
        if prefix.queries < series.last_queries:
            series.last_queries = series.last_hits = 0
        series.prefix_queries.inc(prefix.queries - series.last_queries)
        series.prefix_hits.inc(max(0, prefix.hits - series.last_hits))
        series.last_queries, series.last_hits = prefix.queries, prefix.hits
        series.preemptions.inc(max(0, scheduler_stats.num_preemptions - series.last_preemptions))
        series.last_preemptions = scheduler_stats.num_preemptions
        self._record_spec(scheduler_stats, series)
        series.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        series.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for value in iteration_stats.time_to_first_tokens_s:
            series.ttft.observe(value)
        for value in iteration_stats.inter_token_latencies_s:
            series.itl.observe(value)
        for finished in iteration_stats.finished_requests:
            series.e2e.observe(finished.e2e_latency_s)
            self._success.labels(*series.labels, str(finished.finish_reason)).inc()

    def _record_spec(self, scheduler_stats: SchedulerStats, series: _EngineSeries) -> None:
        spec = scheduler_stats.spec_decoding_stats
        drafts, draft_tokens, accepted = series.last_spec
        series.spec_drafts.inc(spec.num_drafts - drafts)
        series.spec_draft_tokens.inc(spec.num_draft_tokens - draft_tokens)
        series.spec_accepted.inc(spec.num_accepted_tokens - accepted)
        series.last_spec = (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)
        for position, count in enumerate(spec.num_accepted_tokens_per_pos):
            before = series.last_spec_per_pos[position] if position < len(series.last_spec_per_pos) else 0
            self._spec_per_pos.labels(*series.labels, str(position)).inc(count - before)
        series.last_spec_per_pos = list(spec.num_accepted_tokens_per_pos)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def refresh_gauges(engine: Any, stat_logger: PrometheusStatLogger) -> None:
    """Set the gauges (running, waiting, KV-cache usage) to the engine's state now, before a scrape.

    The stat loggers hear from the engine after each step only, so once it goes idle the gauges would keep the
    last busy step's values until the next request; vLLM's core publishes its stats again when it goes idle.
    mini asks the engine core on each scrape instead (one utility call; a single engine core: with data
    parallelism each core's series is left as its last step set it). A dead or stopped engine is left alone."""
    if len(stat_logger.engine_indexes) != 1 or not engine.is_running or engine.errored:
        return
    try:
        stats = await engine.get_scheduler_stats()
    except Exception:  # noqa: BLE001  (the engine died meanwhile: /health says so; the scrape still answers)
        return
    series = stat_logger.series[stat_logger.engine_indexes[0]]
    series.running.set(stats.num_running_reqs)
    series.waiting.set(stats.num_waiting_reqs)
    series.kv_usage.set(stats.kv_cache_usage)
