"""vLLM v0.33.0's own implementations of phase 06's mirrored functions pass phase 06's checks.

Read from `$MINI_VLLM_SOURCE` (skipped without it); adapted only in their call shape:
* `check_stop_strings` (vllm/v1/engine/detokenizer.py): as is.
* `check_stop` (vllm/v1/core/sched/utils.py): the check's requests carry `sampling_params.eos_token_id` as the
  engine's input processor sets it (None under ignore_eos, as vLLM's SamplingParams), which vLLM compares with;
  a thin view adds what mini's request and params lack: no pooling params, no repetition detection (vLLM's
  fourth rule, behind the `min_tokens` gate), and an int `max_tokens` (vLLM's input processor always sets one;
  mini's None means "up to max_model_len").
* `detokenize_incrementally` (vllm/tokenizers/detokenizer_utils.py): vLLM appends the new token's string
  itself from `all_input_ids[-1]`; mini's signature receives it already appended to `tokens`.
* `step` has no single vLLM counterpart (vLLM splits it between `EngineCore.step` and `LLMEngine.step`).
* `ParentRequest` (vllm/v1/engine/parallel_sampling.py): vLLM's reads the parent's params as `request.params`
  and needs an `external_req_id`, so it is handed a view of mini's EngineCoreRequest. Graded on all three
  output kinds (until 2026-11-27 mini showed every child's latest output under `CUMULATIVE`, and this test
  left that kind out; mini now passes on only the child that reported, as vLLM).
* `beam_search_step`: vLLM's `BeamSearchOfflineMixin._beam_search_step`
  (vllm/entrypoints/generate/beam_search/offline.py), with vLLM's own `BeamSearchSequence` and
  `create_sort_beams_key_function` (.../beam_search/utils.py), run on one instance with no structured output;
  the engine call it makes is answered from the check's logprob tables.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing

from labs.checks.p06 import (
    check_beam_search_step,
    check_check_stop,
    check_check_stop_strings,
    check_detokenize_incrementally,
    check_parent_request,
)
from mini.beam_search import BeamSearchSequence
from mini.core.request import RequestStatus
from mini.engine import EngineCoreRequest
from mini.outputs import CompletionOutput, Logprob
from mini.sampling_params import RequestOutputKind, SamplingParams
from tests.course.fidelity import vllm_definition


def test_vllm_check_stop_strings_passes():
    check = vllm_definition("vllm/v1/engine/detokenizer.py", "check_stop_strings", {"sys": sys})
    check_check_stop_strings(check)


class VllmRequestView:
    """mini's Request seen through vLLM's attribute names; writes go to the mini request."""

    def __init__(self, request):
        params = request.sampling_params
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "pooling_params", None)
        object.__setattr__(self, "sampling_params", types.SimpleNamespace(
            eos_token_id=params.eos_token_id, stop_token_ids=params.stop_token_ids, min_tokens=params.min_tokens,
            repetition_detection=None))
        object.__setattr__(self, "max_tokens", request.max_tokens if request.max_tokens is not None else sys.maxsize)

    def __getattr__(self, name):
        return getattr(self._request, name)

    def __setattr__(self, name, value):
        setattr(self._request, name, value)


def test_vllm_check_stop_passes():
    namespace = {"RequestStatus": RequestStatus, "check_sequence_repetition": lambda *args: False}
    vllm_check_stop = vllm_definition("vllm/v1/core/sched/utils.py", "check_stop", namespace)
    check_check_stop(lambda request, max_model_len: vllm_check_stop(VllmRequestView(request), max_model_len))


def test_vllm_detokenize_incrementally_passes():
    namespace: dict = {}
    for helper in ("_replace_none_with_empty", "_convert_tokens_to_string_with_added_encoders"):
        vllm_definition("vllm/tokenizers/detokenizer_utils.py", helper, namespace)
    vllm_detokenize = vllm_definition("vllm/tokenizers/detokenizer_utils.py", "detokenize_incrementally", namespace)

    def detokenize_incrementally(tokenizer, tokens, prefix_offset, read_offset):
        new_token_id = tokenizer.convert_tokens_to_ids(tokens[-1])
        _, new_text, prefix_offset, read_offset = vllm_detokenize(
            tokenizer, [new_token_id], tokens[:-1], prefix_offset, read_offset)
        return new_text, prefix_offset, read_offset

    check_detokenize_incrementally(detokenize_incrementally)


def test_vllm_parent_request_passes():
    import copy

    namespace = {"copy": copy.copy, "cast": typing.cast, "CompletionOutput": CompletionOutput,
                 "RequestOutputKind": RequestOutputKind, "SamplingParams": SamplingParams,
                 "EngineCoreRequest": EngineCoreRequest, "IterationStats": object}
    vllm_parent_request = vllm_definition("vllm/v1/engine/parallel_sampling.py", "ParentRequest", namespace)

    def parent_request(request):
        view = types.SimpleNamespace(request_id=request.request_id, external_req_id=request.request_id,
                                     params=request.sampling_params)
        return vllm_parent_request(view)

    check_parent_request(parent_request)   # FINAL_ONLY, DELTA and CUMULATIVE


def test_vllm_beam_search_step_passes():
    path = "vllm/entrypoints/generate/beam_search/utils.py"
    namespace = {"Any": typing.Any, "Logprob": Logprob, "LoRARequest": object, "TokensInput": dict,
                 "MultiModalInput": dict, "EncoderDecoderInput": dict}
    # vllm_definition drops decorators: vLLM's class is a @dataclass
    vllm_sequence = dataclasses.dataclass(vllm_definition(path, "BeamSearchSequence", namespace))
    vllm_definition(path, "get_beam_search_score", namespace)
    sort_key = vllm_definition(path, "create_sort_beams_key_function", namespace)
    step_namespace = {"BeamSearchSequence": vllm_sequence, "math": __import__("math"),
                      "itertools": __import__("itertools"), "RequestOutput": object}
    vllm_step = vllm_definition("vllm/entrypoints/generate/beam_search/offline.py",
                                "BeamSearchOfflineMixin._beam_search_step", step_namespace)

    class EngineAnswers:
        """The `self` of _beam_search_step: its one engine call returns the check's logprob tables."""

        def __init__(self, tables):
            self.tables = tables

        def _params_to_seq(self, params, count):
            return [params] * count

        def _render_and_run_requests(self, prompts, params, **_):
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(
                logprobs=None if table is None else [table], finish_reason="length")]) for table in self.tables]

    def to_vllm(beam):
        return vllm_sequence(beam.orig_prompt, tokens=list(beam.tokens), logprobs=list(beam.logprobs),
                             cum_logprob=beam.cum_logprob)

    def to_mini(beam):
        return BeamSearchSequence(orig_prompt=beam.orig_prompt, tokens=list(beam.tokens),
                                  logprobs=list(beam.logprobs), cum_logprob=beam.cum_logprob)

    def beam_search_step(instance, beam_logprobs, beam_width, length_penalty, eos_token_id):
        state = types.SimpleNamespace(beams=[to_vllm(b) for b in instance.beams],
                                      completed=[to_vllm(b) for b in instance.completed], priority=0)
        vllm_step(EngineAnswers(beam_logprobs), [state], types.SimpleNamespace(logprob_token_ids=None),
                  set() if eos_token_id is None else {eos_token_id}, False, beam_width, sort_key(length_penalty),
                  None, None, None)
        instance.beams = [to_mini(b) for b in state.beams]
        instance.completed = [to_mini(b) for b in state.completed]

    check_beam_search_step(beam_search_step)
