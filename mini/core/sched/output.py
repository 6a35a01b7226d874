"""Mirrors vllm/v1/core/sched/output.py: what the scheduler tells the model runner each step.

New requests (and requests resumed after preemption) are sent in full once, as `NewRequestData`;
requests the runner already knows are sent as a diff in `CachedRequestData` (only the blocks added
this step). `num_computed_tokens` is the count BEFORE this step: the runner computes tokens
`num_computed_tokens .. num_computed_tokens + num_scheduled_tokens[req_id] - 1`.

`EngineCoreOutput`, what `update_from_output` returns for the output processor, is in mini/engine/__init__.py,
where vLLM keeps it (vllm/v1/engine/__init__.py).

mini's choices: a request resumed after preemption comes back as `NewRequestData` (as vLLM does for its
v2 model runner; for the v1 runner vLLM sends it in `CachedRequestData` with its token ids), and a
preempted request's id is in `finished_req_ids` as well as in `preempted_req_ids`, so the runner drops its
state through one set (vLLM keeps the two apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini.core.request import Request
    from mini.lora.request import LoRARequest
    from mini.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Tokens sampled so far: empty for a brand-new request, non-empty for one resumed after preemption.
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    lora_request: LoRARequest | None = None   # the adapter the runner maps this request's tokens to

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int], num_computed_tokens: int) -> NewRequestData:
        return cls(
            req_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.sampling_params,
            block_ids=list(block_ids),
            num_computed_tokens=num_computed_tokens,
            lora_request=request.lora_request,
        )


@dataclass(slots=True)
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # blocks appended this step
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Finished, aborted or preempted since the last step: the runner drops their state.
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Requests that got only part of their remaining prompt this step (a chunked prefill).
    partial_prefill_req_ids: set[str] = field(default_factory=set)
    # Speculative decoding: request id -> the draft tokens scheduled for verification this step (they are
    # the last len(drafts) of the request's num_scheduled_tokens).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    step: int = 0
