"""check_stop follows vLLM v0.33.0's order (vllm/v1/core/sched/utils.py::check_stop): EOS, then stop token
ids, then the length limits; min_tokens does not gate EOS or stop ids there (the MinTokensLogitsProcessor
keeps them from being sampled), and min_tokens still holds back EOS end to end in the engine."""

from __future__ import annotations

import pytest

from mini.core.request import Request, RequestStatus
from mini.core.sched.utils import check_stop
from mini.sampling_params import SamplingParams


def request_with(outputs: list[int], eos: int | None = 2, **params) -> Request:
    request = Request("r", [10, 11, 12], SamplingParams(**params), eos_token_id=eos, arrival_time=0.0)
    request.status = RequestStatus.RUNNING
    request.append_output_token_ids(list(outputs))
    return request


@pytest.mark.parametrize(("outputs", "params", "status", "stop_reason"), [
    ([2], {"min_tokens": 3, "max_tokens": 8}, RequestStatus.FINISHED_STOPPED, None),            # EOS below min
    ([7], {"min_tokens": 3, "max_tokens": 8, "stop_token_ids": [7]}, RequestStatus.FINISHED_STOPPED, 7),
    ([5, 2], {"max_tokens": 2}, RequestStatus.FINISHED_STOPPED, None),                           # EOS before length
    ([5, 7], {"max_tokens": 2, "stop_token_ids": [7]}, RequestStatus.FINISHED_STOPPED, 7),
    ([2], {"ignore_eos": True, "min_tokens": 1, "max_tokens": 8}, RequestStatus.RUNNING, None),
    ([5, 6], {"max_tokens": 2, "min_tokens": 2}, RequestStatus.FINISHED_LENGTH_CAPPED, None),
])
def test_check_stop_order_is_vllms(outputs, params, status, stop_reason):
    request = request_with(outputs, **params)
    assert check_stop(request, max_model_len=64) is (status != RequestStatus.RUNNING)
    assert request.status == status and request.stop_reason == stop_reason


def test_length_cap_at_max_model_len_after_eos_check():
    request = request_with([5, 2], max_tokens=16)
    assert check_stop(request, max_model_len=5) and request.status == RequestStatus.FINISHED_STOPPED
    request = request_with([5, 6], max_tokens=16)
    assert check_stop(request, max_model_len=5) and request.status == RequestStatus.FINISHED_LENGTH_CAPPED
