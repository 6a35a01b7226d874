"""Mirrors vllm/v1/core/sched/scheduler.py: the continuous-batching scheduler.

There are no prefill and decode phases. Every request wants `num_tokens - num_computed_tokens`
more tokens computed (the whole prompt at first, 1 per step while decoding), and each step hands
out at most `max_num_batched_tokens` of them:

1. RUNNING requests first, in order. If the KV pool cannot hold a request's new tokens, preempt a
   victim (FCFS: the most recently admitted; priority: the worst (priority, arrival_time), the first
   such in `running`), free its blocks, send it back to the waiting queue, and retry. A request that
   preempts itself ends the running pass under FCFS; under priority the pass goes on with the next one.
2. Then, only if nobody was preempted, WAITING requests, while budget and `max_num_seqs` allow,
   starting after their prefix-cache hits.

A chunked prefill is simply a request granted fewer tokens than it wants; `long_prefill_token_threshold`
caps one request's tokens per step, except when it is the only request (nobody to starve).

mini's own step: blocks allocated this step to a request that is then preempted (priority policy) were
cached at allocation but never written; mini takes them out of the prefix cache
(`uncache_uncomputed_blocks`). vLLM v0.33.0 frees them with their hashes, so a later lookup can hit
blocks that hold no KV.

Speculative decoding adds nothing new to that rule: a running request with draft tokens wants
`num_tokens_with_spec - num_computed_tokens` tokens (its last sampled token plus k drafts), and the drafts
that fit go out in `scheduled_spec_decode_tokens`. After the step, `update_from_output` moves
`num_computed_tokens` back past the drafts the rejection sampler refused (`rollback_spec_tokens`): their
KV slots hold wrong keys and values, and are simply overwritten later. No block is freed (vLLM neither).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched import utils as sched_utils
from mini.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from mini.core.sched.request_queue import SchedulingPolicy, create_request_queue
from mini.engine import EngineCoreOutput
from mini.metrics.stats import SpecDecodingStats
from mini.structured_output.request import GrammarVerdict

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.runner_outputs import ModelRunnerOutput


# Every step that completes a request's known tokens samples one more (vLLM: `num_sampled_tokens_per_step`,
# 0 only for pooling models, which mini does not serve).
NUM_SAMPLED_TOKENS_PER_STEP = 1


def num_tokens_to_schedule(num_tokens: int, num_computed_tokens: int, token_budget: int,
                           long_prefill_token_threshold: int, max_model_len: int) -> int:
    """How many of a request's uncomputed tokens it gets this step (0 if none fit).

    It wants `num_tokens - num_computed_tokens`; a positive `long_prefill_token_threshold` caps that (with
    chunked prefill), then the budget left this step, then the length limit: the step samples one token
    after the ones it computes, and that token too must sit at a position < `max_model_len`, so at most
    `max_model_len - num_computed_tokens - 1` (vLLM: `max_model_len - num_computed_tokens -
    num_sampled_tokens_per_step` in `Scheduler.schedule`). The scheduler passes the smaller of
    max_model_len and the pool's capacity.
    """
    num_new_tokens = num_tokens - num_computed_tokens
    if 0 < long_prefill_token_threshold < num_new_tokens:
        num_new_tokens = long_prefill_token_threshold
    num_new_tokens = min(num_new_tokens, token_budget)
    return max(0, min(num_new_tokens, max_model_len - num_computed_tokens - NUM_SAMPLED_TOKENS_PER_STEP))


def select_preemption_victim(running: list[Request], policy: SchedulingPolicy) -> Request:
    """The running request to preempt when the KV pool is full.

    FCFS: the most recently admitted (the end of `running`). PRIORITY: the worst (priority,
    arrival_time); on a tie the one earliest in `running` (Python's `max` keeps the first maximum), as
    vLLM's `Scheduler.schedule` does in vllm/v1/core/sched/scheduler.py.
    """
    if policy is SchedulingPolicy.PRIORITY:
        return max(running, key=lambda r: (r.priority, r.arrival_time))
    return running[-1]


def rollback_spec_tokens(num_computed_tokens: int, num_scheduled_spec_tokens: int,
                         num_generated_tokens: int) -> tuple[int, int]:
    """After a verification step: (num_computed_tokens without the rejected drafts, drafts accepted).

    At schedule time the request's `num_computed_tokens` already moved past all 1 + k scheduled tokens (its
    last sampled token and k drafts). The step generated g tokens: g - 1 accepted drafts, then the target's
    own token (a recovered token after a rejection, or the bonus token after k acceptances). So k + 1 - g
    drafts were rejected: the KV written at their positions belongs to tokens that are not in the sequence.
    Mirrors the rejection bookkeeping in vllm/v1/core/sched/scheduler.py `update_from_output`.
    """
    num_rejected = num_scheduled_spec_tokens + 1 - num_generated_tokens
    return num_computed_tokens - num_rejected, num_generated_tokens - 1


def _grammar_verdict(request: Request, token_id: int) -> GrammarVerdict:
    """What the request's grammar says of one sampled token (ACCEPTED when the request has none)."""
    so_request = request.structured_output_request
    return GrammarVerdict.ACCEPTED if so_request is None else so_request.accept_token(token_id)


def _sampled_logprobs(runner_output: ModelRunnerOutput, req_index: int, num_tokens: int) -> list | None:
    """The logprobs of the request's first `num_tokens` sampled tokens (None when none were asked for)."""
    logprobs = runner_output.logprobs
    if logprobs is None or logprobs[req_index] is None or not num_tokens:
        return None
    return list(logprobs[req_index])[:num_tokens]


class Scheduler:
    """Decides, every step, which requests run and how many tokens each one computes.

    Home of the `scheduler` role (mini/roles.py): `schedule` and the three decisions it and
    `update_from_output` call through `self.` (`num_tokens_to_schedule`, `select_preemption_victim`,
    `check_stop`); an engine built with other parts uses a subclass holding them. (`rollback_spec_tokens` is
    plain bookkeeping, not a part: the course teaches it inside the EAGLE proposer's input preparation.)
    """

    num_tokens_to_schedule = staticmethod(num_tokens_to_schedule)
    select_preemption_victim = staticmethod(select_preemption_victim)
    check_stop = staticmethod(sched_utils.check_stop)

    def __init__(self, config: EngineConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.max_num_running_reqs = config.max_num_seqs
        self.max_num_scheduled_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len if config.max_model_len is not None else 1 << 62
        # The most tokens one request can ever hold: the whole pool (minus the null block). A
        # request that would outgrow it is finished with "length" instead of waiting forever.
        self.max_request_len = min(self.max_model_len, kv_cache_manager.num_usable_tokens)
        self.enable_chunked_prefill = config.enable_chunked_prefill
        # A cap on one request's tokens per step; it only means something with chunked prefill.
        threshold = config.long_prefill_token_threshold or 0
        self.long_prefill_token_threshold = threshold if self.enable_chunked_prefill else 0
        self.policy = SchedulingPolicy.parse(config.scheduling_policy)

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Finished / aborted / preempted since the last schedule(): told to the runner next step.
        self.finished_req_ids: set[str] = set()
        # Structured output: requests whose grammar still compiles wait here, outside the queue `schedule`
        # reads, until `promote_ready_grammars` (after every step) moves them to its front.
        self.waiting_for_grammar: list[Request] = []
        self.step_index = 0
        self.num_preemptions_total = 0
        # Speculative decoding: k drafts per request and step; a drafter with its own KV cache writes the
        # drafts' keys and values ahead of the verified tokens, so an allocation that ends the request's known
        # tokens reserves k lookahead slots (vLLM: `num_lookahead_tokens`).
        spec = config.speculative_config
        self.num_spec_tokens = 0 if spec is None else spec.num_speculative_tokens
        self.num_lookahead_tokens = self.num_spec_tokens if spec is not None and spec.needs_kv_cache else 0
        self.spec_decoding_stats = SpecDecodingStats(num_spec_tokens=self.num_spec_tokens)
        # LoRA: at most this many distinct adapters among the running requests (0: LoRA off).
        self.max_loras = config.max_loras if getattr(config, "enable_lora", False) else 0

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, request: Request) -> None:
        """Queue a request. Raises ValueError (changing nothing) if it could never be scheduled."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        if request.num_tokens >= self.max_request_len:
            # As vLLM's input processor (`_validate_prompt_len`): a prompt must leave a position for at least
            # one sampled token, or its last token could never be scheduled (see num_tokens_to_schedule).
            raise ValueError(
                f"prompt_token_ids has {request.num_tokens} tokens; at most {self.max_request_len - 1} fit, "
                f"leaving one position for a sampled token (max_model_len={self.max_model_len}, KV pool "
                f"capacity {self.kv_cache_manager.num_usable_tokens})")
        self.requests[request.request_id] = request
        if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
            if not request.structured_output_request.is_grammar_ready():
                self.waiting_for_grammar.append(request)
                return
            request.status = RequestStatus.WAITING
        self.waiting.add_request(request)

    def finish_requests(self, request_ids: str | list[str], finished_status: RequestStatus) -> None:
        """Finish requests from outside (abort, stop string); unknown or finished ids are ignored."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a FINISHED_* status, got {finished_status!r}")
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for request_id in ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            elif request in self.waiting_for_grammar:
                self.waiting_for_grammar.remove(request)
            else:
                self.waiting.remove_request(request)
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.kv_cache_manager.forget_request(request.request_id)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) requests (vLLM: `Scheduler.get_request_counts`); requests whose grammar compiles
        count as waiting, as they stay in vLLM's waiting queue."""
        return len(self.running), len(self.waiting) + len(self.waiting_for_grammar)

    def long_prefill_token_threshold_for_step(self) -> int:
        """The threshold of this step: 0 (no cap) when at most one request is running or waiting, as vLLM's
        `Scheduler.schedule`: a lone request has nobody to starve, so it may use the whole budget."""
        num_running, num_waiting = self.get_request_counts()
        return self.long_prefill_token_threshold if num_running + num_waiting > 1 else 0

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def get_num_unfinished_requests(self) -> int:
        return sum(self.get_request_counts())

    # ------------------------------------------------------------------ schedule
    def _cap_new_tokens(self, num_new_tokens: int, num_computed_tokens: int, token_budget: int,
                        long_prefill_token_threshold: int) -> int:
        """How many of the wanted tokens a request gets: threshold, budget and length caps."""
        return self.num_tokens_to_schedule(num_computed_tokens + num_new_tokens, num_computed_tokens, token_budget,
                                           long_prefill_token_threshold, self.max_request_len)

    def _lookahead(self, request: Request, num_tokens_after_step: int) -> int:
        """Speculative decoding: extra slots for a drafter's KV, never past the longest a request may get.

        Only a step that reaches the request's last known token is followed by drafting; a prefill chunk
        gets none. `allocate_slots` caches the full blocks of the slots it is asked for (up to the request's
        known tokens), so lookahead slots inside an unfinished prompt would publish blocks this step never
        writes as prefix-cache hits.
        """
        if num_tokens_after_step < request.num_tokens:
            return 0
        return max(0, min(self.num_lookahead_tokens, self.max_request_len - num_tokens_after_step))

    @staticmethod
    def _num_running_tokens_wanted(request: Request) -> int:
        """The tokens a running request wants computed: its known ones and drafts not computed yet, plus (async
        scheduling) the tokens of steps in flight, which are next step's inputs (vLLM: the same sum)."""
        return request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens

    def _pick_victim(self) -> Request:
        return self.select_preemption_victim(self.running, self.policy)

    @staticmethod
    def _take_drafts_to_verify(request: Request, num_new_tokens: int) -> list[int]:
        """Speculative decoding: the request's drafts that fit its `num_new_tokens` are verified this step, the
        rest are dropped. Its drafts are consumed here (vLLM clears them at schedule time too): the drafter
        proposes the next ones after this step."""
        num_scheduled_spec_tokens = request.num_computed_tokens + num_new_tokens - request.num_tokens
        drafts = request.spec_token_ids[:num_scheduled_spec_tokens] if num_scheduled_spec_tokens > 0 else []
        request.spec_token_ids = []
        return drafts

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []  # drafted for a KV cache that is gone; proposed again after the re-prefill
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.finished_req_ids.add(request.request_id)
        self.waiting.prepend_request(request)

    def schedule(self) -> SchedulerOutput:  # noqa: C901 - mirrors vLLM's one-function schedule()
        """One scheduling decision (the scheduler role's policy step): running requests first, then waiting
        ones while nobody was preempted (module docstring).

        vLLM's scheduler skips a `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` request inside its waiting loop;
        mini keeps such a request out of the queue instead (`waiting_for_grammar`) until its grammar is
        compiled, so this step never meets one, and a policy written without structured output in mind (phase
        05's) stays right with it.
        """
        token_budget = self.max_num_scheduled_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        preempted: list[Request] = []
        scheduled_spec_decode_tokens: dict[str, list[int]] = {}
        long_prefill_token_threshold = self.long_prefill_token_threshold_for_step()

        # 1. Running requests, oldest first.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._cap_new_tokens(
                self._num_running_tokens_wanted(request), request.num_computed_tokens,
                token_budget, long_prefill_token_threshold)
            if num_new_tokens == 0:
                req_index += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new_tokens + self._lookahead(request, request.num_computed_tokens + num_new_tokens))
                if new_blocks is not None:
                    break
                victim = self._pick_victim()
                if victim in scheduled_running:
                    # Priority policy can pick a request already scheduled this step: undo that.
                    scheduled_running.remove(victim)
                    token_budget += num_scheduled_tokens.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    scheduled_spec_decode_tokens.pop(victim.request_id, None)
                    self.kv_cache_manager.uncache_uncomputed_blocks(victim)
                if self.running.index(victim) < req_index:
                    req_index -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                # The request preempted itself. FCFS: it was the last running request, nothing else fits.
                # PRIORITY: the ones after it are more important and may fit in the blocks it just freed;
                # it left `running`, so req_index already points at the next one (as vLLM).
                if self.policy is SchedulingPolicy.PRIORITY:
                    continue
                break
            drafts = self._take_drafts_to_verify(request, num_new_tokens)
            if drafts:
                scheduled_spec_decode_tokens[request.request_id] = drafts
            scheduled_running.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = [block.block_id for block in new_blocks]
            token_budget -= num_new_tokens
            req_index += 1

        # 2. Waiting requests, only when nobody was preempted this step.
        if not preempted:
            # LoRA (vLLM: `scheduled_loras`): the adapters of every running request, scheduled this step or not; a
            # waiting request whose adapter would make one too many is skipped this step and keeps its place.
            scheduled_loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}
            skipped_waiting: list[Request] = []
            while self.waiting and token_budget > 0 and len(self.running) < self.max_num_running_reqs:
                request = self.waiting.peek_request()
                lora = request.lora_request
                if (self.max_loras and lora is not None and lora.lora_int_id not in scheduled_loras
                        and len(scheduled_loras) >= self.max_loras):
                    skipped_waiting.append(self.waiting.pop_request())
                    continue
                hit_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
                num_new_tokens = request.num_tokens - num_hit_tokens
                if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                    break
                num_new_tokens = self._cap_new_tokens(num_new_tokens, num_hit_tokens, token_budget,
                                                      long_prefill_token_threshold)
                if num_new_tokens == 0:
                    break
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new_tokens + self._lookahead(request, num_hit_tokens + num_new_tokens), num_hit_tokens,
                    hit_blocks)
                if new_blocks is None:
                    break
                # Counted once, at admission (vLLM: "so unscheduled lookups are not counted").
                self.kv_cache_manager.record_prefix_cache_stats(request, num_hit_tokens)
                self.waiting.pop_request()
                self.running.append(request)
                scheduled_new.append(request)
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_hit_tokens
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_hit_tokens
                num_scheduled_tokens[request.request_id] = num_new_tokens
                token_budget -= num_new_tokens
                if lora is not None:
                    scheduled_loras.add(lora.lora_int_id)
            for request in reversed(skipped_waiting):
                self.waiting.prepend_request(request)
        scheduler_output = self._make_output(scheduled_new, scheduled_running, num_scheduled_tokens,
                                             new_block_ids, preempted)
        scheduler_output.scheduled_spec_decode_tokens = scheduled_spec_decode_tokens
        # Advance the counters now, as vLLM's _update_after_schedule: the next schedule() may run
        # before these tokens' outputs come back.
        for request_id, num_tokens in num_scheduled_tokens.items():
            self.requests[request_id].num_computed_tokens += num_tokens
        self.finished_req_ids = set()
        self.step_index += 1
        return scheduler_output

    def _make_output(self, scheduled_new: list[Request], scheduled_running: list[Request],
                     num_scheduled_tokens: dict[str, int], new_block_ids: dict[str, list[int]],
                     preempted: list[Request]) -> SchedulerOutput:
        manager = self.kv_cache_manager
        new_reqs = [NewRequestData.from_request(r, manager.get_block_ids(r.request_id), r.num_computed_tokens)
                    for r in scheduled_new]
        cached_reqs = CachedRequestData(
            req_ids=[r.request_id for r in scheduled_running],
            new_block_ids=[new_block_ids[r.request_id] for r in scheduled_running],
            num_computed_tokens=[r.num_computed_tokens for r in scheduled_running],
        )
        partial = {req_id for req_id, n in num_scheduled_tokens.items()
                   if self.requests[req_id].num_computed_tokens + n < self.requests[req_id].num_tokens}
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            finished_req_ids=set(self.finished_req_ids),
            preempted_req_ids={r.request_id for r in preempted},
            partial_prefill_req_ids=partial,
            step=self.step_index,
        )

    # ------------------------------------------------------------------ results of a step
    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
                           ) -> list[EngineCoreOutput]:
        """Append each scheduled request's sampled tokens, check its stops, free the finished ones at once.

        vLLM: `Scheduler.update_from_output` (vllm/v1/core/sched/scheduler.py), one pass per request.
        """
        outputs: list[EngineCoreOutput] = []
        stopped: set[Request] = set()
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted (or otherwise finished) after it was scheduled
            output = self._update_request(request, scheduler_output, model_runner_output)
            if request.is_finished():
                stopped.add(request)
            if output is not None:
                outputs.append(output)
        if stopped:
            self.running = [r for r in self.running if r not in stopped]
        self.promote_ready_grammars()
        return outputs

    def promote_ready_grammars(self) -> None:
        """Structured output: requests whose grammar has compiled become WAITING, at the front of the queue
        in arrival order (vLLM puts the requests it skipped back at the front of its waiting queue)."""
        ready = [r for r in self.waiting_for_grammar if r.structured_output_request.is_grammar_ready()]
        for request in reversed(ready):
            self.waiting_for_grammar.remove(request)
            request.status = RequestStatus.WAITING
            self.waiting.prepend_request(request)

    def _update_request(self, request: Request, scheduler_output: SchedulerOutput,
                        runner_output: ModelRunnerOutput) -> EngineCoreOutput | None:
        """One request's share of a step: verify its drafts, append its tokens, then free it (stopped) or
        keep its next drafts. -> its output, or None when it has nothing to report."""
        request_id = request.request_id
        req_index = runner_output.req_id_to_index[request_id]
        sampled = runner_output.sampled_token_ids
        generated = list(sampled[req_index]) if sampled else []
        num_draft_tokens = len(scheduler_output.scheduled_spec_decode_tokens.get(request_id, []))
        num_accepted = self._verify_drafts(request, num_draft_tokens, len(generated))
        new_token_ids, is_stopped = self._append_tokens(request, generated)
        if is_stopped:
            self._free_request(request)
        elif runner_output.spec_token_ids is not None:
            request.spec_token_ids = self._accept_drafts(
                request, runner_output.spec_token_ids[req_index],
                is_prefill_chunk=request_id in scheduler_output.partial_prefill_req_ids)
        new_prompt_logprobs = runner_output.prompt_logprobs.get(request_id)
        if not (new_token_ids or is_stopped or new_prompt_logprobs):
            return None
        return EngineCoreOutput(
            request_id=request_id, new_token_ids=new_token_ids,
            finish_reason=request.get_finished_reason(), stop_reason=request.stop_reason,
            new_logprobs=_sampled_logprobs(runner_output, req_index, len(new_token_ids)),
            new_prompt_logprobs=new_prompt_logprobs, num_cached_tokens=max(request.num_cached_tokens, 0),
            num_draft_tokens=num_draft_tokens, num_accepted_tokens=num_accepted)

    def _verify_drafts(self, request: Request, num_draft_tokens: int, num_generated_tokens: int) -> int:
        """Speculative decoding: forget the KV of the drafts the rejection sampler refused -> drafts accepted.

        A step that returned no token for the request verified nothing: no rollback, no draft recorded
        (vLLM's `update_from_output` requires generated tokens too). The drafts are consumed either way.
        """
        num_accepted = 0
        if num_draft_tokens and num_generated_tokens:
            request.num_computed_tokens, num_accepted = rollback_spec_tokens(
                request.num_computed_tokens, num_draft_tokens, num_generated_tokens)
            self.spec_decoding_stats.observe_draft(num_draft_tokens, num_accepted)
        request.spec_token_ids = []
        return num_accepted

    def _append_tokens(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        """Append the sampled tokens one at a time until one ends the request -> (the tokens kept, stopped).

        vLLM: `Scheduler._update_request_with_output`. Each token goes to the request's grammar first
        (structured output): a token it refuses finishes the request with "error" and is not appended.
        """
        for position, token_id in enumerate(new_token_ids):
            verdict = _grammar_verdict(request, int(token_id))
            if verdict is GrammarVerdict.REJECTED:
                request.status = RequestStatus.FINISHED_ERROR
                request.stop_reason = request.structured_output_request.rejection_reason(int(token_id))
                return new_token_ids[:position], True
            request.append_output_token_ids(int(token_id))
            if self._is_stopped(request, verdict):
                return new_token_ids[:position + 1], True
        return new_token_ids, False

    def _is_stopped(self, request: Request, verdict: GrammarVerdict) -> bool:
        """`check_stop` on the token just appended; else a grammar that is complete (it took EOS) stops the
        request too, which matters with ignore_eos."""
        if self.check_stop(request, self.max_request_len):
            return True
        if verdict is GrammarVerdict.COMPLETED:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = request.output_token_ids[-1]
            return True
        return False

    def _accept_drafts(self, request: Request, draft_token_ids: list[int], is_prefill_chunk: bool) -> list[int]:
        """The drafts proposed after this step that the next step will verify.

        As vLLM's `Scheduler.update_draft_token_ids`: none for a request still in the middle of its prefill
        (it sampled no token, whatever a drafter returned for its row). mini's own trimming on top: none past
        max_model_len / the pool, none past max_tokens (the step that verifies k drafts emits up to k + 1
        tokens), and none while `min_tokens` still masks the stop tokens (that mask depends on the position,
        which mini's verification step does not track)."""
        if is_prefill_chunk:
            return []
        params = request.sampling_params
        if request.num_output_tokens < params.min_tokens:
            return []
        room = self.max_request_len - request.num_tokens
        if request.max_tokens is not None:
            room = min(room, request.max_tokens - request.num_output_tokens - 1)
        return [int(token) for token in draft_token_ids[:max(room, 0)]]

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (vLLM: `Scheduler.reset_prefix_cache`); False while blocks are in use."""
        return self.kv_cache_manager.reset_prefix_cache()
