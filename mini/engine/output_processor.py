"""Mirrors vllm/v1/engine/output_processor.py: engine-core outputs (token ids) -> RequestOutputs (text).

Each step the scheduler returns one `EngineCoreOutput` per request that made progress: its new token
ids, and a finish reason if the engine core stopped it (EOS, stop token, length). For each, the output
processor
  1. detokenizes the new tokens incrementally and checks the stop strings (a match finishes the
     request here, so its id goes into `reqs_to_abort`: the engine must tell the scheduler; tokens that
     arrived after the one completing the stop string are dropped, as vLLM's `_trim_surplus_tokens`),
  2. converts the logprobs,
  3. builds the `RequestOutput` the user sees (CUMULATIVE: everything so far; DELTA: only what is new;
     FINAL_ONLY: only at the end), under the parent's id for a parallel-sampling child
     (mini/engine/parallel_sampling.py decides what it shows).
As vLLM's, `process_outputs` returns one RequestOutput per reporting request: the n children of one parent
that report in the same step give up to n RequestOutputs with the parent's id, one child each (`AsyncLLM`'s
collector folds them by sample index for its reader).

`RequestOutputCollector` is one request's mailbox between the output processor and an `AsyncLLM.generate`
reader (vLLM keeps it in this file too): at most one unread output, a slow reader getting the newer outputs
merged into it (`merge_delta_outputs` for DELTA, `replace_by_index` otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mini import roles
from mini.engine.detokenizer import IncrementalDetokenizer, OffsetIncrementalDetokenizer
from mini.engine.logprobs import LogprobsProcessor
from mini.engine.parallel_sampling import ParentRequest
from mini.metrics.stats import SpecDecodingStats
from mini.outputs import CompletionOutput, RequestOutput
from mini.sampling_params import RequestOutputKind

if TYPE_CHECKING:
    from mini.engine import EngineCoreOutput, EngineCoreRequest


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
        with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.put, output)

    async def get(self) -> RequestOutput:
        while self.output is None:
            await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


@dataclass(slots=True)
class RequestState:
    """Everything the output processor keeps about one engine-core request."""

    request_id: str
    parent_req: ParentRequest | None
    request_index: int
    output_kind: RequestOutputKind
    prompt: str | None
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    logprobs_processor: LogprobsProcessor
    num_cached_tokens: int = 0
    # Speculative decoding: this request's own drafts and accepted drafts (RequestOutput.metrics).
    spec_decoding_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    lora_request: Any = None   # the adapter it runs with, echoed on every RequestOutput (vLLM's RequestState)

    @classmethod
    def from_new_request(
        cls, tokenizer: Any | None, request: EngineCoreRequest, parent_req: ParentRequest | None,
        request_index: int, text_detokenizer: type[OffsetIncrementalDetokenizer] | None = None,
    ) -> RequestState:
        params = request.sampling_params
        return cls(
            request_id=request.request_id,
            parent_req=parent_req,
            request_index=request_index,
            output_kind=params.output_kind,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            detokenizer=IncrementalDetokenizer.from_new_request(tokenizer, request, text_detokenizer),
            logprobs_processor=LogprobsProcessor(tokenizer, params.logprobs, params.prompt_logprobs),
            lora_request=getattr(request, "lora_request", None),
        )

    def make_request_output(
        self, new_token_ids: list[int], finish_reason: str | None, stop_reason: int | str | None
    ) -> RequestOutput | None:
        finished = finish_reason is not None
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completion = self._new_completion_output(new_token_ids, finish_reason, stop_reason)
        request_id, outputs = self.request_id, [completion]
        if self.parent_req is not None:
            request_id = self.parent_req.request_id
            outputs, finished = self.parent_req.get_outputs(self.request_id, completion)
            if not outputs:
                return None
        delta = self.output_kind == RequestOutputKind.DELTA
        prompt_logprobs = (self.logprobs_processor.pop_prompt_logprobs() if delta
                           else self.logprobs_processor.prompt_logprobs)
        spec = self.spec_decoding_stats
        return RequestOutput(
            request_id=request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=outputs, finished=finished,
            num_cached_tokens=self.num_cached_tokens, lora_request=self.lora_request,
            metrics={"spec_decoding": dataclasses.replace(
                spec, num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos))} if spec.num_drafts else None,
        )

    def _new_completion_output(
        self, new_token_ids: list[int], finish_reason: str | None, stop_reason: int | str | None
    ) -> CompletionOutput:
        finished = finish_reason is not None
        delta = self.output_kind == RequestOutputKind.DELTA
        text = self.detokenizer.get_next_output_text(finished, delta)
        token_ids = list(new_token_ids) if delta else list(self.detokenizer.output_token_ids)
        logprobs = self.logprobs_processor.logprobs
        if logprobs is not None:
            logprobs = logprobs[len(logprobs) - len(token_ids):] if delta else list(logprobs)
        return CompletionOutput(
            index=self.request_index, text=text, token_ids=token_ids,
            cumulative_logprob=self.logprobs_processor.cumulative_logprob, logprobs=logprobs,
            finish_reason=finish_reason if finished else None,
            stop_reason=stop_reason if finished else None,
        )


class OutputProcessor:
    """Turns EngineCoreOutputs into RequestOutputs; owns the per-request detokenizers.

    `config`: the engine's EngineConfig (None: none); its `parts` (mini/roles.py) pick the detokenizers' class.
    """

    def __init__(self, tokenizer: Any | None, config: Any = None) -> None:
        self.tokenizer = tokenizer
        self.text_detokenizer = roles.resolve(config, OffsetIncrementalDetokenizer)
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def has_unfinished_requests(self) -> bool:
        return len(self.request_states) > 0

    def add_request(
        self, request: EngineCoreRequest, parent_req: ParentRequest | None = None, request_index: int = 0
    ) -> None:
        request_id = request.request_id
        if request_id in self.request_states:
            raise ValueError(f"request_id {request_id!r} is already running; request ids must be unique")
        if parent_req is not None:
            known = self.parent_requests.get(parent_req.request_id)
            if known is not None and known is not parent_req:
                raise ValueError(f"request_id {parent_req.request_id!r} is already running")
            self.parent_requests[parent_req.request_id] = parent_req
        elif request_id in self.parent_requests:
            raise ValueError(f"request_id {request_id!r} is already running; request ids must be unique")
        self.request_states[request_id] = RequestState.from_new_request(
            self.tokenizer, request, parent_req, request_index, self.text_detokenizer
        )

    def has_request(self, request_id: str) -> bool:
        """True if `request_id` is an unfinished request (or an unfinished parallel-sampling parent)."""
        return request_id in self.request_states or request_id in self.parent_requests

    def child_request_ids(self, request_ids: list[str]) -> list[str]:
        """Alias of engine_request_ids (the name the engine uses)."""
        return self.engine_request_ids(request_ids)

    def engine_request_ids(self, request_ids: list[str]) -> list[str]:
        """User-level ids -> the engine-core ids still running (a parallel-sampling parent -> its children)."""
        engine_ids: list[str] = []
        for request_id in request_ids:
            parent = self.parent_requests.get(request_id)
            if parent is not None:
                engine_ids.extend(sorted(cid for cid in parent.child_requests if cid in self.request_states))
            elif request_id in self.request_states:
                engine_ids.append(request_id)
        return engine_ids

    def process_outputs(
        self, engine_core_outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], list[str]]:
        """-> (RequestOutputs to hand to the user, ids finished by a stop string to abort in the scheduler)."""
        request_outputs: list[RequestOutput] = []
        reqs_to_abort: list[str] = []
        for engine_core_output in engine_core_outputs:
            req_state = self.request_states.get(engine_core_output.request_id)
            if req_state is None:
                continue  # aborted meanwhile
            new_token_ids = list(engine_core_output.new_token_ids)
            finish_reason = engine_core_output.finish_reason
            stop_reason = engine_core_output.stop_reason
            finished_in_core = finish_reason is not None
            req_state.num_cached_tokens = engine_core_output.num_cached_tokens
            if engine_core_output.num_draft_tokens:  # speculative decoding
                req_state.spec_decoding_stats.observe_draft(engine_core_output.num_draft_tokens,
                                                            engine_core_output.num_accepted_tokens)

            num_prev_tokens = len(req_state.detokenizer.output_token_ids)
            stop_string = req_state.detokenizer.update(new_token_ids, finish_reason == "stop")
            new_logprobs = engine_core_output.new_logprobs
            if stop_string is not None:
                finish_reason, stop_reason = "stop", stop_string
                # Tokens after the one completing the stop string are dropped (_trim_surplus_tokens).
                num_kept = len(req_state.detokenizer.output_token_ids) - num_prev_tokens
                new_token_ids = new_token_ids[:num_kept]
                if new_logprobs is not None:
                    new_logprobs = list(new_logprobs)[:num_kept]
            logprobs_processor = req_state.logprobs_processor
            logprobs_processor.update_sample_logprobs(new_token_ids, new_logprobs)
            logprobs_processor.update_prompt_logprobs(engine_core_output.new_prompt_logprobs)

            request_output = req_state.make_request_output(new_token_ids, finish_reason, stop_reason)
            if request_output is not None:
                request_outputs.append(request_output)
            if finish_reason is not None:
                self._forget(req_state)
                if not finished_in_core:
                    reqs_to_abort.append(req_state.request_id)
        return request_outputs, reqs_to_abort

    def abort_requests(self, request_ids: list[str]) -> list[RequestOutput]:
        """Finish the given requests (user ids or engine ids) with finish_reason "abort"."""
        request_outputs: list[RequestOutput] = []
        for engine_id in self.engine_request_ids(list(request_ids)):
            req_state = self.request_states[engine_id]
            # Every kind (FINAL_ONLY too) gets a final output; held-back text is released.
            request_output = req_state.make_request_output([], "abort", None)
            if request_output is not None:
                request_outputs.append(request_output)
            self._forget(req_state)
        return request_outputs

    def _forget(self, req_state: RequestState) -> None:
        self.request_states.pop(req_state.request_id, None)
        parent = req_state.parent_req
        if parent is not None and not parent.child_requests:
            self.parent_requests.pop(parent.request_id, None)
