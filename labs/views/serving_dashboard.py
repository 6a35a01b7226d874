"""Mirrors no vllm/v1 file: a live dashboard of a serving engine (what vLLM's Grafana board shows).

It is a stat logger for `mini.engine.async_llm.AsyncLLM` (the engine's documented hook, the same one the
server's Prometheus logger uses, as vllm/v1/metrics/loggers.py): after every step its output-handler task hands
it `(SchedulerStats, IterationStats)`; it keeps running / waiting requests, KV-cache usage and the tokens
each step generated, and draws them against time: while a burst of clients runs, `watch()` redraws every
`period_s` seconds.

    dashboard = ServingDashboard()
    engine.stat_loggers.append(dashboard)
    display(dashboard.widget())
    await dashboard.watch(run_burst())      # in a notebook (top-level await)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class DashboardSample:
    time_s: float               # since the dashboard was created
    running: int
    waiting: int
    kv_cache_usage: float       # 0..1
    generation_tokens: int      # tokens this step produced


class ServingDashboard:
    """Collects one sample per engine step; `figure()` draws them, `widget()` + `watch()` keep it live."""

    def __init__(self, max_samples: int = 20_000) -> None:
        self.start = time.monotonic()
        self.samples: list[DashboardSample] = []
        self.max_samples = max_samples
        self._lock = threading.Lock()
        self._output: Any = None

    def __call__(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        sample = DashboardSample(time.monotonic() - self.start, scheduler_stats.num_running_reqs,
                                 scheduler_stats.num_waiting_reqs, scheduler_stats.kv_cache_usage,
                                 iteration_stats.num_generation_tokens)
        with self._lock:
            self.samples.append(sample)
            del self.samples[:-self.max_samples]

    def snapshot(self) -> list[DashboardSample]:
        with self._lock:
            return list(self.samples)

    def tokens_per_s(self, bucket_s: float = 0.25) -> tuple[list[float], list[float]]:
        """Generated tokens per second, in buckets of `bucket_s` -> (bucket start times, rates)."""
        samples = self.snapshot()
        if not samples:
            return [], []
        buckets: dict[int, int] = {}
        for sample in samples:
            key = int(sample.time_s // bucket_s)
            buckets[key] = buckets.get(key, 0) + sample.generation_tokens
        keys = range(min(buckets), max(buckets) + 1)
        return [k * bucket_s for k in keys], [buckets.get(k, 0) / bucket_s for k in keys]

    def figure(self) -> Any:
        import matplotlib.pyplot as plt

        samples = self.snapshot()
        times = [s.time_s for s in samples]
        fig, (ax_reqs, ax_kv, ax_tps) = plt.subplots(1, 3, figsize=(12, 3))
        ax_reqs.step(times, [s.running for s in samples], where="post", label="running")
        ax_reqs.step(times, [s.waiting for s in samples], where="post", label="waiting")
        ax_reqs.set(title="requests", xlabel="s")
        ax_reqs.legend(loc="upper right")
        ax_kv.plot(times, [100 * s.kv_cache_usage for s in samples], color="tab:green")
        ax_kv.set(title="KV-cache usage (%)", xlabel="s", ylim=(0, 100))
        bucket_times, rates = self.tokens_per_s()
        ax_tps.bar(bucket_times, rates, width=0.25, align="edge", color="tab:purple")
        ax_tps.set(title="generated tokens / s", xlabel="s")
        fig.tight_layout()
        return fig

    def text(self, _: Any = None) -> str:
        """What the dashboard shows, as plain text: the samples so far, the last one, the peaks."""
        from labs.views.text_view import header

        samples = self.snapshot()
        if not samples:
            return f"{header('the serving dashboard')}\nno engine step yet"
        last = samples[-1]
        _, rates = self.tokens_per_s()
        return (f"{header('the serving dashboard')}\n{len(samples)} engine steps over {last.time_s:.1f} s; now: "
                f"{last.running} running, {last.waiting} waiting, KV cache {100 * last.kv_cache_usage:.0f}% used\n"
                f"peaks: {max(s.running for s in samples)} running, {max(s.waiting for s in samples)} waiting, "
                f"KV cache {100 * max(s.kv_cache_usage for s in samples):.0f}%, "
                f"{max(rates, default=0):.0f} generated tokens/s; {sum(s.generation_tokens for s in samples)} "
                f"tokens in all")

    def widget(self) -> Any:
        """The live chart (an Output widget in a box whose `text()` / `text/plain` is `self.text()`); without
        ipywidgets, a text view (print it again after the run)."""
        from labs.views.text_view import TextView, have_widgets, view_box

        if not have_widgets():
            return TextView(self.text)
        import ipywidgets as widgets

        self._output = widgets.Output()
        self.refresh()
        return view_box([self._output], self.text)

    def refresh(self) -> None:
        """Redraw into the widget (no-op before `widget()`)."""
        if self._output is None:
            return
        import matplotlib.pyplot as plt
        from IPython.display import display

        fig = self.figure()
        with self._output:
            self._output.clear_output(wait=True)
            display(fig)
        plt.close(fig)

    async def watch(self, awaitable: Awaitable[Any], period_s: float = 0.5) -> Any:
        """Await `awaitable` (a burst of clients), redrawing every `period_s`; -> its result."""
        task = asyncio.ensure_future(awaitable)
        while not task.done():
            await asyncio.wait([task], timeout=period_s)
            self.refresh()
        return task.result()
