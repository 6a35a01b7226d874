"""Structured output answers, the scheduler decides: a request's grammar returns a verdict on each sampled
token (`StructuredOutputRequest.accept_token`), and only the scheduler turns it into a request status
(vllm/v1/core/sched/scheduler.py `update_from_output`)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from mini.config import EngineConfig
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request, RequestStatus
from mini.core.sched.scheduler import Scheduler
from mini.runner_outputs import ModelRunnerOutput
from mini.sampling_params import SamplingParams, StructuredOutputsParams
from mini.structured_output.request import FailedGrammar, GrammarVerdict, StructuredOutputRequest

EOS = 0


class FakeGrammar:
    """Takes the tokens in `allowed`; taking EOS (in an accepting state) completes it."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.taken: list[int] = []
        self.terminated = False

    def accept_tokens(self, token_ids: list[int]) -> bool:
        if self.terminated or any(token not in self.allowed for token in token_ids):
            return False
        self.taken.extend(token_ids)
        self.terminated = EOS in token_ids
        return True

    def is_terminated(self) -> bool:
        return self.terminated


def so_request(grammar) -> StructuredOutputRequest:
    request = StructuredOutputRequest(StructuredOutputsParams(regex="a+"))
    if grammar is not None:
        request.grammar = grammar
    return request


def test_the_grammar_gives_a_verdict_and_never_a_status():
    grammar = FakeGrammar({EOS, 5, 6})
    request = so_request(grammar)
    assert request.accept_token(5) is GrammarVerdict.ACCEPTED
    assert request.accept_token(7) is GrammarVerdict.REJECTED
    assert "token 7 refused" in request.rejection_reason(7)
    assert request.accept_token(EOS) is GrammarVerdict.COMPLETED
    assert grammar.taken == [5, EOS]
    assert not hasattr(request, "status")


@pytest.mark.parametrize(("grammar", "reason"), [
    (None, "before the grammar was compiled"),
    (FailedGrammar(ValueError("bad pattern")), "grammar compilation failed: bad pattern"),
])
def test_no_grammar_or_a_failed_one_rejects_with_its_reason(grammar, reason):
    request = so_request(grammar)
    assert request.accept_token(3) is GrammarVerdict.REJECTED
    assert reason in request.rejection_reason(3)


def run_one_step(grammar: FakeGrammar, sampled: list[int], **params) -> tuple[Request, list]:
    scheduler = Scheduler(EngineConfig(max_model_len=64), KVCacheManager(16, 4))
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
        regex="a+"), **params), eos_token_id=EOS)
    request.structured_output_request.grammar = grammar
    assert request.status is RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert request.status is RequestStatus.RUNNING
    outputs = scheduler.update_from_output(output, ModelRunnerOutput(["r"], {"r": 0}, [sampled]))
    return request, outputs


def test_the_scheduler_finishes_a_refused_token_with_error_and_does_not_emit_it():
    request, [output] = run_one_step(FakeGrammar({5}), [7])
    assert request.status is RequestStatus.FINISHED_ERROR and output.finish_reason == "error"
    assert output.new_token_ids == [] and request.output_token_ids == []
    assert "token 7 refused" in output.stop_reason


def test_the_scheduler_stops_a_request_whose_grammar_completed_even_with_ignore_eos():
    request, [output] = run_one_step(FakeGrammar({EOS, 5}), [EOS], ignore_eos=True)
    assert request.status is RequestStatus.FINISHED_STOPPED
    assert (output.finish_reason, output.stop_reason, output.new_token_ids) == ("stop", EOS, [EOS])


def test_an_accepted_token_keeps_the_request_running():
    request, [output] = run_one_step(FakeGrammar({5}), [5])
    assert request.status is RequestStatus.RUNNING and output.finish_reason is None
    assert output.new_token_ids == [5]


def test_a_request_whose_grammar_compiles_stays_out_of_the_queue_the_policy_step_reads():
    """Any `schedule` (phase 05's knows nothing of grammars) never meets a request whose grammar compiles:
    the scheduler holds it aside and moves it to the front of the queue after the step its grammar is ready."""
    scheduler = Scheduler(EngineConfig(max_model_len=64), KVCacheManager(16, 4))
    plain = Request("plain", [4, 5], SamplingParams(max_tokens=4), eos_token_id=EOS)
    constrained = Request("so", [1, 2, 3], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        regex="a+")), eos_token_id=EOS)
    compiling: Future = Future()
    constrained.structured_output_request.grammar = compiling
    scheduler.add_request(constrained)
    scheduler.add_request(plain)
    assert [r.request_id for r in scheduler.waiting] == ["plain"]
    assert scheduler.get_request_counts() == (0, 2) and scheduler.has_unfinished_requests()
    output = scheduler.schedule()
    assert list(output.num_scheduled_tokens) == ["plain"]
    compiling.set_result(FakeGrammar({5}))
    scheduler.update_from_output(output, ModelRunnerOutput(req_ids=["plain"], req_id_to_index={"plain": 0},
                                                           sampled_token_ids=[[9]]))
    assert constrained.status is RequestStatus.WAITING and scheduler.waiting_for_grammar == []
    assert list(scheduler.schedule().num_scheduled_tokens) == ["plain", "so"]


def test_aborting_a_request_whose_grammar_compiles_forgets_it():
    scheduler = Scheduler(EngineConfig(max_model_len=64), KVCacheManager(16, 4))
    request = Request("so", [1, 2, 3], SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")),
                      eos_token_id=EOS)
    request.structured_output_request.grammar = Future()
    scheduler.add_request(request)
    scheduler.finish_requests("so", RequestStatus.FINISHED_ABORTED)
    assert scheduler.waiting_for_grammar == [] and not scheduler.has_unfinished_requests()
