"""A request's mailbox between the engine and its consumer, and the statistics counted as outputs leave.

Mirrors `RequestOutputCollector` of vllm/v1/engine/output_processor.py and `IterationStats` /
`FinishedRequestStats` of vllm/v1/metrics/stats.py. Both `AsyncLLM` designs use them: the in-process one
(mini/engine/async_llm.py, an engine thread) and the multiprocess one (mini/engine/async_llm_mp.py, an
output-handler task), so they sit below both. `mini.engine.async_llm` re-exports every name (phase 13's
exercises and checks import them from there).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from mini.metrics.stats import SchedulerStats
from mini.outputs import CompletionOutput, RequestOutput
from mini.sampling_params import RequestOutputKind


def merge_delta_outputs(pending: RequestOutput, new: RequestOutput) -> RequestOutput:
    """Fold a newer DELTA output into an unread one: texts/tokens/logprobs appended per sample index.

    vLLM: `RequestOutput.add(next_output, aggregate=True)` (vllm/outputs.py). The samples keep vLLM's order:
    `pending`'s as they were, then any index heard from only now, in `new`'s order."""
    by_index: dict[int, CompletionOutput] = {c.index: dataclasses.replace(c, token_ids=list(c.token_ids))
                                             for c in pending.outputs}
    for completion in new.outputs:
        old = by_index.get(completion.index)
        if old is None:
            by_index[completion.index] = completion
            continue
        logprobs = old.logprobs
        if completion.logprobs is not None:
            logprobs = (logprobs or []) + list(completion.logprobs)
        by_index[completion.index] = dataclasses.replace(
            completion, text=old.text + completion.text, token_ids=old.token_ids + list(completion.token_ids),
            logprobs=logprobs)
    return dataclasses.replace(
        new, outputs=list(by_index.values()),
        prompt_logprobs=pending.prompt_logprobs if pending.prompt_logprobs is not None else new.prompt_logprobs)


def replace_by_index(pending: RequestOutput, new: RequestOutput) -> RequestOutput:
    """Fold a newer CUMULATIVE / FINAL_ONLY output into an unread one: each sample index keeps its newest output
    (vLLM: `RequestOutput.add(next_output, aggregate=False)`), so with n > 1, where each output carries one
    child, a reader who falls behind still sees every child heard from. Same order as `merge_delta_outputs`."""
    by_index = {completion.index: completion for completion in pending.outputs}
    by_index.update((completion.index, completion) for completion in new.outputs)  # a known index keeps its place
    return dataclasses.replace(
        new, outputs=list(by_index.values()),
        prompt_logprobs=pending.prompt_logprobs if pending.prompt_logprobs is not None else new.prompt_logprobs)


class RequestOutputCollector:
    """One request's mailbox (vLLM: RequestOutputCollector): at most one unread output, or an error.

    `put` runs on the event loop (the engine thread schedules it with call_soon_threadsafe); `get`
    awaits the next output.
    """

    def __init__(self, output_kind: RequestOutputKind, loop: asyncio.AbstractEventLoop) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.loop = loop
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if isinstance(self.output, BaseException):
            return  # an error already waits: it is final
        if self.output is None or isinstance(output, BaseException):
            self.output = output
        elif self.aggregate:
            self.output = merge_delta_outputs(self.output, output)
        else:
            self.output = replace_by_index(self.output, output)
        self.ready.set()

    def put_threadsafe(self, output: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.put, output)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            pass

    async def get(self) -> RequestOutput:
        while self.output is None:
            await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


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


__all__ = ["FinishedRequestStats", "IterationStats", "RequestOutputCollector", "RequestTiming", "StatLogger",
           "merge_delta_outputs", "record_output"]
