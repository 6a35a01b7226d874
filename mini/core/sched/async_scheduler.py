"""The scheduler for async scheduling: step N+1 is scheduled before step N's tokens are known.

Mirrors vllm/v1/core/sched/async_scheduler.py (`AsyncScheduler._update_after_schedule`) and the async branches
of vllm/v1/core/sched/scheduler.py (`num_output_placeholders` in `schedule`, `_update_request_with_output`,
`_preempt_request`). With async scheduling the engine core (`EngineCore.step_with_batch_queue`,
mini/engine/core.py) calls `schedule()` for step N+1 while step N's forward runs. A request step N will sample
a token for has that token's position
counted already: `num_computed_tokens` moved past it at schedule time, and `num_output_placeholders` says how
many of the tokens it counts are not known yet. Step N+1 feeds the placeholder as the request's next input; the
model runner fills it in, because it runs the steps in order and appended step N's sample to its own copy of
the request before step N+1 starts (vLLM's GPU runner instead scatters `prev_sampled_token_ids` into the input
ids on the device, since its host has not seen the token yet).

What changes against synchronous scheduling, and how output stays identical:
  * a request stopped by step N's token (EOS, a stop id or string, an abort) may already be in step N+1: that
    step's token for it is discarded (the request is gone when its output arrives), as vLLM does;
  * a request whose in-flight steps will bring it to `max_tokens` is not scheduled again (vLLM: the same test);
  * a request preempted while a step holding it is in flight still gets that step's token when it arrives
    ("stale" output, vLLM's `num_stale_output_tokens`): appended, stop-checked, reported; it re-prefills with it;
  * a block whose last token was a placeholder at allocation is hashed once the token is known
    (`KVCacheManager.cache_blocks`, as vLLM's `update_from_output` calls it under async scheduling).
mini differs: no speculative decoding or pipeline parallelism with it (refused by `validate_async_scheduling` in
mini/config.py), so one sampled token per step and at most one step in flight.
"""

from __future__ import annotations

from mini.core.request import Request, RequestStatus
from mini.core.sched.output import SchedulerOutput
from mini.core.sched.scheduler import Scheduler
from mini.engine import EngineCoreOutput
from mini.runner_outputs import ModelRunnerOutput


class AsyncScheduler(Scheduler):
    """A `Scheduler` that lets the next step be scheduled before the outputs of the one in flight are back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Requests preempted while a step holding them was in flight: that step's output is "stale".
        self.stale_req_ids: set[str] = set()

    # ------------------------------------------------------------------ schedule
    def _num_running_tokens_wanted(self, request: Request) -> int:
        """None once the steps in flight bring the request to max_tokens (it will finish; vLLM skips it too)."""
        if request.num_output_placeholders > 0 and request.max_tokens is not None and (
                request.num_output_tokens + request.num_output_placeholders >= request.max_tokens):
            return 0
        return super()._num_running_tokens_wanted(request)

    def schedule(self) -> SchedulerOutput:
        """`Scheduler.schedule`, then one placeholder per request that samples this step (vLLM:
        `AsyncScheduler._update_after_schedule`). A prefill chunk that ends inside the prompt samples nothing."""
        scheduler_output = super().schedule()
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id not in scheduler_output.partial_prefill_req_ids:
                self.requests[req_id].num_output_placeholders += 1
        return scheduler_output

    def has_pending_structured_output_tokens(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether a scheduled request under a grammar has a token in flight: its bitmask must wait for that
        token (vLLM: `SchedulerOutput.pending_structured_output_tokens`)."""
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and request.structured_output_request is not None and (
                    request.num_output_placeholders > (req_id not in scheduler_output.partial_prefill_req_ids)):
                return True
        return False

    def _preempt(self, request: Request) -> None:
        had_placeholders = request.num_output_placeholders > 0
        super()._preempt(request)
        request.num_output_placeholders = 0
        if had_placeholders:
            self.stale_req_ids.add(request.request_id)

    # ------------------------------------------------------------------ results of a step
    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
                           ) -> list[EngineCoreOutput]:
        stale_outputs = []
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id in self.stale_req_ids:
                self.stale_req_ids.discard(req_id)
                output = self._update_stale_request(req_id, model_runner_output)
                if output is not None:
                    stale_outputs.append(output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for req_id in scheduler_output.num_scheduled_tokens:   # the tokens are known: hash their full blocks
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.RUNNING:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        return stale_outputs + outputs

    def _update_request(self, request: Request, scheduler_output: SchedulerOutput,
                        runner_output: ModelRunnerOutput) -> EngineCoreOutput | None:
        """Every token the step returns resolves a placeholder, the ones cut at a stop included."""
        sampled = runner_output.sampled_token_ids
        num_generated = len(sampled[runner_output.req_id_to_index[request.request_id]]) if sampled else 0
        request.num_output_placeholders = max(0, request.num_output_placeholders - num_generated)
        return super()._update_request(request, scheduler_output, runner_output)

    def _update_stale_request(self, req_id: str, runner_output: ModelRunnerOutput) -> EngineCoreOutput | None:
        """A step in flight when its request was preempted: keep its token (the synchronous engine had it
        before the preemption), which the request's re-prefill then includes."""
        request = self.requests.get(req_id)
        sampled = runner_output.sampled_token_ids
        if request is None or request.is_finished() or not sampled:
            return None
        req_index = runner_output.req_id_to_index[req_id]
        new_token_ids, is_stopped = self._append_tokens(request, list(sampled[req_index]))
        if is_stopped:
            self.waiting.remove_request(request)
            self._free_request(request)
        if not (new_token_ids or is_stopped):
            return None
        logprobs = runner_output.logprobs
        new_logprobs = None
        if logprobs is not None and logprobs[req_index] is not None and new_token_ids:
            new_logprobs = list(logprobs[req_index])[:len(new_token_ids)]
        return EngineCoreOutput(
            request_id=req_id, new_token_ids=new_token_ids, finish_reason=request.get_finished_reason(),
            stop_reason=request.stop_reason, new_logprobs=new_logprobs,
            num_cached_tokens=max(request.num_cached_tokens, 0))


def async_scheduler_class(scheduler_class: type[Scheduler]) -> type[Scheduler]:
    """The async form of a scheduler class: `AsyncScheduler` itself, or, for a `Scheduler` subclass holding
    replaced parts (mini/roles.py), a class with both (the async bookkeeping around the learner's parts)."""
    if scheduler_class is Scheduler or issubclass(scheduler_class, AsyncScheduler):
        return AsyncScheduler if scheduler_class is Scheduler else scheduler_class
    return type(f"Async{scheduler_class.__name__}", (AsyncScheduler, scheduler_class),
                {"__module__": scheduler_class.__module__})
