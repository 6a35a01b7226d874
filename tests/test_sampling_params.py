"""SamplingParams: vLLM defaults, normalization, and one error (naming the field) per bad value."""

from __future__ import annotations

import copy

import pytest

from mini.sampling_params import SAMPLING_EPS, RequestOutputKind, SamplingParams

VLLM_DEFAULTS = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": [],
    "stop_token_ids": [], "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None,
    "prompt_logprobs": None, "include_stop_str_in_output": False, "skip_special_tokens": True,
    "logit_bias": None, "allowed_token_ids": None, "bad_words": [], "detokenize": True,
    "output_kind": RequestOutputKind.CUMULATIVE, "extra_args": None,
}


def test_defaults_match_vllm():
    params = SamplingParams()
    for name, expected in VLLM_DEFAULTS.items():
        assert getattr(params, name) == expected, name
    assert params.temperature >= SAMPLING_EPS and params.seed is None  # random, unseeded
    assert params.all_stop_token_ids == set()
    assert params.output_text_buffer_length == 0


BAD_VALUES = [
    ("n", 0), ("n", -3),
    ("presence_penalty", 2.5), ("presence_penalty", -2.1),
    ("frequency_penalty", 3.0), ("frequency_penalty", -2.5),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("temperature", -1.0), ("temperature", float("inf")), ("temperature", float("nan")),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.1),
    ("top_k", -2), ("top_k", -100),
    ("min_p", -0.1), ("min_p", 1.1),
    ("max_tokens", 0), ("max_tokens", -1),
    ("min_tokens", -1),
    ("logprobs", -2), ("prompt_logprobs", -5),
    ("stop", [""]), ("stop", ["ok", ""]),
    ("stop_token_ids", [-1]),
    ("bad_words", [""]),
    ("allowed_token_ids", []),
]


@pytest.mark.parametrize("field_name,value", BAD_VALUES)
def test_bad_value_raises_value_error_naming_field(field_name, value):
    with pytest.raises(ValueError, match=field_name):
        SamplingParams(**{field_name: value})


BAD_TYPES = [
    ("n", 1.5), ("n", "2"), ("max_tokens", "5"), ("max_tokens", 5.0), ("top_k", 1.0), ("min_tokens", None),
    ("temperature", "0.5"), ("temperature", None), ("top_p", True), ("seed", 1.5), ("logprobs", "3"),
    ("stop", 5), ("stop", ["a", 3]), ("stop_token_ids", [1.0]), ("stop_token_ids", 3),
    ("allowed_token_ids", ["a"]), ("logit_bias", [1, 2]), ("logit_bias", {"x": 1.0}),
    ("logit_bias", {1: "big"}), ("ignore_eos", 1), ("detokenize", "yes"), ("output_kind", "delta"),
    ("output_kind", 1), ("extra_args", [1]), ("bad_words", 3),
]


@pytest.mark.parametrize("field_name,value", BAD_TYPES)
def test_wrong_type_raises_value_error_naming_field(field_name, value):
    """As vLLM (and as the README promises): a value of the wrong type is a bad value, ValueError."""
    with pytest.raises(ValueError, match=field_name) as raised:
        SamplingParams(**{field_name: value})
    assert type(raised.value) is ValueError


def test_readme_examples_of_wrong_types_raise_value_error():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=123)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature="hot")


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    assert SamplingParams(min_tokens=5, max_tokens=5).min_tokens == 5


def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop="x", detokenize=False)


def test_greedy_resets_sampling_knobs_and_rejects_n():
    params = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (params.top_p, params.top_k, params.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(temperature=1e-6).temperature < SAMPLING_EPS  # greedy
    with pytest.raises(ValueError, match="n must be 1"):
        SamplingParams(temperature=0.0, n=2)


def test_tiny_temperature_clamped():
    assert SamplingParams(temperature=0.001).temperature == pytest.approx(0.01)


def test_normalizations_as_vllm():
    params = SamplingParams(top_k=-1, seed=-1, stop="END", stop_token_ids=[5, 3, 5], logprobs=True,
                            bad_words=["a", "a", "b"])
    assert params.top_k == 0
    assert params.seed is None
    assert params.stop == ["END"]
    assert params.stop_token_ids == [5, 3]
    assert params.all_stop_token_ids == {3, 5}
    assert params.logprobs == 1
    assert params.bad_words == ["a", "b"]
    assert params.output_text_buffer_length == 2
    assert SamplingParams(stop=["ab", "abcd"], include_stop_str_in_output=True).output_text_buffer_length == 0
    assert SamplingParams(logprobs=-1).logprobs == -1
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_logit_bias_keys_converted_and_values_clamped():
    params = SamplingParams(logit_bias={"3": 500, 4: -1000.0, 5: 1.5})
    assert params.logit_bias == {3: 100.0, 4: -100.0, 5: 1.5}


def test_eos_bookkeeping():
    params = SamplingParams(stop_token_ids=[7])
    params.update_from_eos(2)
    assert params.eos_token_id == 2
    assert params.all_stop_token_ids == {2, 7}
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_eos(2)
    assert ignoring.eos_token_id is None
    assert ignoring.all_stop_token_ids == {2}  # still known, so min_tokens can mask it


def test_clone_is_deep_and_independent():
    params = SamplingParams(stop=["x"], stop_token_ids=[1], logit_bias={1: 1.0}, extra_args={"k": [1]})
    clone = params.clone()
    assert clone == params and clone is not params
    clone.stop.append("y")
    clone.extra_args["k"].append(2)
    clone.update_from_eos(9)
    assert params.stop == ["x"] and params.extra_args == {"k": [1]}
    assert params.all_stop_token_ids == {1}
    assert copy.copy(params) == params


def test_output_kinds_exist():
    assert {k.name for k in RequestOutputKind} == {"CUMULATIVE", "DELTA", "FINAL_ONLY"}
    assert SamplingParams(output_kind=RequestOutputKind.DELTA).output_kind is RequestOutputKind.DELTA
