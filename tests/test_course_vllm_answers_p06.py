"""vLLM v0.33.0's own implementations of phase 06's mirrored functions pass phase 06's checks.

Read from `$MINI_VLLM_SOURCE` (skipped without it); adapted only in their call shape:
* `check_stop_strings` (vllm/v1/engine/detokenizer.py): as is.
* `check_stop` (vllm/v1/core/sched/utils.py): vLLM's Request differs from mini's in three attribute
  names, so a thin view gives it `sampling_params.eos_token_id` (None under ignore_eos, as vLLM's
  SamplingParams does), no pooling params or repetition detection, and an int `max_tokens` (vLLM's
  input processor always sets one; mini's None means "up to max_model_len").
* `detokenize_incrementally` (vllm/tokenizers/detokenizer_utils.py): vLLM appends the new token's string
  itself from `all_input_ids[-1]`; mini's signature receives it already appended to `tokens`.
* `step` has no single vLLM counterpart (vLLM splits it between `EngineCore.step` and `LLMEngine.step`).
"""

from __future__ import annotations

import sys
import types

from course_fidelity import vllm_definition

from labs.checks.p06 import check_check_stop, check_check_stop_strings, check_detokenize_incrementally
from mini.core.request import RequestStatus


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
            eos_token_id=None if params.ignore_eos else request.eos_token_id,
            stop_token_ids=params.stop_token_ids, min_tokens=params.min_tokens, repetition_detection=None))
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
