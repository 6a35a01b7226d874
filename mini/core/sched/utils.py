"""Mirrors vllm/v1/core/sched/utils.py: check_stop, run after each sampled token (the scheduler holds it as
`Scheduler.check_stop`, a part of the `scheduler` role)."""

from __future__ import annotations

from mini.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether the token just appended ends the request; set its status (and stop_reason).

    vLLM v0.33.0's order (`check_stop` in vllm/v1/core/sched/utils.py): the EOS token (unless ignore_eos),
    then stop_token_ids, then the length limits (max_model_len, max_tokens). `min_tokens` does not gate
    EOS or stop ids here: the MinTokensLogitsProcessor keeps them from being sampled before min_tokens
    (vLLM's check_stop consults min_tokens only for repetition detection, which mini does not have).
    """
    params = request.sampling_params
    last_token_id = request.output_token_ids[-1]
    eos_token_id = None if params.ignore_eos else request.eos_token_id
    if eos_token_id is not None and last_token_id == eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    max_tokens = request.max_tokens
    if request.num_tokens >= max_model_len or (max_tokens is not None and request.num_output_tokens >= max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
