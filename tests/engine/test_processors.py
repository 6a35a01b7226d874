"""InputProcessor validation, OutputProcessor (kinds, stop strings, logprobs, abort), parallel sampling."""

from __future__ import annotations

import copy
import os

import pytest

from mini.engine import EngineCoreOutput
from mini.engine.input_processor import InputProcessor
from mini.engine.output_processor import OutputProcessor
from mini.engine.parallel_sampling import ParentRequest, fan_out
from mini.outputs import Logprob
from mini.sampling_params import RequestOutputKind, SamplingParams

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DELTA = RequestOutputKind.DELTA
FINAL_ONLY = RequestOutputKind.FINAL_ONLY


def build_tokenizer():
    """A tiny byte-level BPE trained in memory (emoji/CJK split over several tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["Hello world! The quick brown fox.", "café 😀 日本語 中文", "stop END done"] * 3
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture()
def processor(tokenizer):
    return InputProcessor(tokenizer, vocab_size=len(tokenizer), max_model_len=32, eos_token_id=1)


# ----------------------------------------------------------------------------------- InputProcessor
def test_text_and_token_prompts(processor, tokenizer):
    params = SamplingParams(max_tokens=4, stop_token_ids=[7])
    request = processor.process("a", "Hello world", params, arrival_time=3.0, priority=2)
    assert request.prompt == "Hello world"
    assert request.prompt_token_ids == tokenizer.encode("Hello world")
    assert (request.request_id, request.arrival_time, request.priority, request.eos_token_id) == ("a", 3.0, 2, 1)
    assert request.sampling_params is not params and request.sampling_params.eos_token_id == 1
    assert request.sampling_params.all_stop_token_ids == {1, 7}
    assert params.eos_token_id is None and params.all_stop_token_ids == {7}  # caller's object untouched
    by_dict = processor.process("b", {"prompt": "Hello world"}, params)
    assert by_dict.prompt_token_ids == request.prompt_token_ids
    by_ids = processor.process("c", {"prompt_token_ids": [5, 6, 7]}, params)
    assert (by_ids.prompt, by_ids.prompt_token_ids) == (None, [5, 6, 7])
    assert by_ids.arrival_time > 0


def test_max_tokens_none_fills_the_context(processor):
    request = processor.process("a", {"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=None))
    assert request.sampling_params.max_tokens == 22


@pytest.mark.parametrize(
    "prompt,error,match",
    [
        ("", ValueError, "empty"),
        ({"prompt_token_ids": []}, ValueError, "empty"),
        ({"prompt_token_ids": list(range(33))}, ValueError, "max_model_len=32"),
        ({"prompt_token_ids": [5, 300, 301]}, ValueError, "300.*vocab_size=300"),
        ({"prompt_token_ids": [5, -1]}, ValueError, "-1"),
        ({"prompt_token_ids": [5, "6"]}, TypeError, "prompt_token_ids"),
        ({"prompt_token_ids": 5}, TypeError, "prompt_token_ids"),
        ({"text": "hi"}, TypeError, "prompt_token_ids"),
        ({"prompt": 5}, TypeError, "prompt"),
        ([1, 2, 3], TypeError, "prompt_token_ids"),
        (None, TypeError, "prompt"),
        (b"bytes", TypeError, "prompt"),
    ],
)
def test_bad_prompts_raise(processor, prompt, error, match):
    with pytest.raises(error, match=match):
        processor.process("x", prompt, SamplingParams())


def test_too_long_message_names_length(processor):
    with pytest.raises(ValueError, match="length 40"):
        processor.process("x", {"prompt_token_ids": [3] * 40}, SamplingParams())
    assert processor.process("x", {"prompt_token_ids": [3] * 32}, SamplingParams()).prompt_token_ids


@pytest.mark.parametrize(
    "params,match",
    [
        (SamplingParams(stop_token_ids=[299, 300]), "stop_token_ids.*300"),
        (SamplingParams(allowed_token_ids=[1, 1000]), "allowed_token_ids.*1000"),
        (SamplingParams(logit_bias={5: 1.0, 777: 2.0}), "logit_bias.*777"),
        (SamplingParams(logprobs=21), "logprobs"),
        (SamplingParams(prompt_logprobs=-1), "prompt_logprobs"),
    ],
)
def test_params_checked_against_the_model(processor, params, match):
    with pytest.raises(ValueError, match=match):
        processor.process("x", "Hello", params)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"priority": "high"}, TypeError, "priority"),
        ({"priority": 1.5}, TypeError, "priority"),
        ({"params": {"temperature": 0}}, TypeError, "params"),
        ({"request_id": 7}, TypeError, "request_id"),
        ({"arrival_time": "now"}, TypeError, "arrival_time"),
    ],
)
def test_bad_argument_types(processor, kwargs, error, match):
    arguments = {"request_id": "x", "prompt": "Hello", "params": SamplingParams()} | kwargs
    with pytest.raises(error, match=match):
        processor.process(**arguments)


def test_no_tokenizer_needs_token_ids():
    processor = InputProcessor(None, vocab_size=50, max_model_len=16, eos_token_id=2)
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        processor.process("x", "Hello", SamplingParams())
    with pytest.raises(ValueError, match="bad_words"):
        processor.process("x", {"prompt_token_ids": [3]}, SamplingParams(bad_words=["no"]))
    assert processor.process("x", {"prompt_token_ids": [3, 4]}, SamplingParams()).prompt_token_ids == [3, 4]


def test_validation_leaves_params_unchanged(processor):
    params = SamplingParams(stop_token_ids=[900], max_tokens=None)
    before = copy.deepcopy(params)
    with pytest.raises(ValueError):
        processor.process("x", "Hello", params)
    assert params == before


def test_bad_words_tokenized(processor, tokenizer):
    request = processor.process("x", "Hello", SamplingParams(bad_words=["world"]))
    assert tokenizer.encode("world", add_special_tokens=False) in request.sampling_params.bad_words_token_ids


# ---------------------------------------------------------------------------------- OutputProcessor
def start(processor, tokenizer, request_id="r", prompt="Hello", **params):
    output_processor = OutputProcessor(tokenizer)
    request = processor.process(request_id, prompt, SamplingParams(**params))
    parent, children = fan_out(request)
    for index, child in enumerate(children):
        output_processor.add_request(child, parent, index)
    return output_processor, [child.request_id for child in children]


def out(request_id, token_ids, finish_reason=None, stop_reason=None, logprobs=None, prompt_logprobs=None):
    return EngineCoreOutput(request_id, list(token_ids), finish_reason, stop_reason, logprobs, prompt_logprobs)


def test_cumulative_outputs_and_length_finish(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer)
    ids = tokenizer.encode(" world 😀")
    outputs, to_abort = output_processor.process_outputs([out("r", ids[:2])])
    assert to_abort == [] and len(outputs) == 1
    first = outputs[0]
    assert first.request_id == "r" and not first.finished and first.prompt == "Hello"
    assert first.outputs[0].token_ids == ids[:2] and first.outputs[0].text == tokenizer.decode(ids[:2])
    assert first.outputs[0].finish_reason is None and not first.outputs[0].finished()
    outputs, _ = output_processor.process_outputs([out("r", ids[2:], finish_reason="length")])
    final = outputs[0].outputs[0]
    assert outputs[0].finished and final.finished()
    assert final.text == " world 😀" and final.token_ids == ids and final.finish_reason == "length"
    assert final.cumulative_logprob is None and final.logprobs is None
    assert not output_processor.has_unfinished_requests()
    assert output_processor.process_outputs([out("r", [5])]) == ([], [])  # unknown ids are ignored


def test_eos_finish_hides_eos_text(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, skip_special_tokens=False)
    ids = tokenizer.encode(" world") + [1]
    outputs, to_abort = output_processor.process_outputs([out("r", ids, finish_reason="stop")])
    completion = outputs[0].outputs[0]
    assert (completion.text, completion.token_ids, completion.stop_reason) == (" world", ids, None)
    assert to_abort == []  # the scheduler stopped it itself


def test_stop_string_finishes_and_asks_for_abort(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, stop=["quick"], max_tokens=10)
    ids = tokenizer.encode(" The quick brown")
    outputs, to_abort = output_processor.process_outputs([out("r", ids)])
    completion = outputs[0].outputs[0]
    assert to_abort == ["r"]
    assert outputs[0].finished and completion.finish_reason == "stop" and completion.stop_reason == "quick"
    assert completion.text == " The "
    assert not output_processor.has_unfinished_requests()


def test_stop_string_drops_the_tokens_after_it_with_their_logprobs(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, stop=["quick"], max_tokens=10, logprobs=0)
    ids = tokenizer.encode(" The quick brown fox")
    completes = next(i for i in range(len(ids) + 1) if "quick" in tokenizer.decode(ids[:i]))
    assert completes < len(ids)
    logprobs = [{token_id: -1.0} for token_id in ids]
    outputs, to_abort = output_processor.process_outputs([out("r", ids, logprobs=logprobs)])
    completion = outputs[0].outputs[0]
    assert to_abort == ["r"] and completion.stop_reason == "quick"
    assert completion.token_ids == ids[:completes] and len(completion.logprobs) == completes


def test_delta_outputs_concatenate(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, output_kind=DELTA, max_tokens=50)
    ids = tokenizer.encode(" café 😀 日本語")
    texts, token_ids = [], []
    for i, token_id in enumerate(ids):
        last = i == len(ids) - 1
        outputs, _ = output_processor.process_outputs([out("r", [token_id], "length" if last else None)])
        texts.append(outputs[0].outputs[0].text)
        token_ids += outputs[0].outputs[0].token_ids
    assert "".join(texts) == " café 😀 日本語" and token_ids == ids
    assert "" in texts  # some steps produced only part of a character: nothing shown


def test_final_only_reports_once(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, output_kind=FINAL_ONLY)
    ids = tokenizer.encode(" world")
    assert output_processor.process_outputs([out("r", ids[:1])]) == ([], [])
    outputs, _ = output_processor.process_outputs([out("r", ids[1:], "length")])
    assert outputs[0].finished and outputs[0].outputs[0].text == " world"


def test_logprobs_converted(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, logprobs=1, prompt_logprobs=1)
    step1 = [{10: -0.5, 11: -1.5}]
    step2 = [{12: -2.0, 13: -0.25}]        # sampled token 12 is not the most likely one
    outputs, _ = output_processor.process_outputs([out("r", [10], logprobs=step1, prompt_logprobs=[{5: -3.0}])])
    first = outputs[0]
    assert first.prompt_logprobs[0] is None and first.prompt_logprobs[1][5].logprob == -3.0
    outputs, _ = output_processor.process_outputs([out("r", [12], "length", logprobs=step2)])
    completion = outputs[0].outputs[0]
    assert completion.cumulative_logprob == pytest.approx(-2.5)
    assert len(completion.logprobs) == 2
    assert completion.logprobs[1][12] == Logprob(-2.0, 2, tokenizer.decode([12]))
    assert completion.logprobs[1][13].rank == 1 and completion.logprobs[0][10].rank == 1
    ranked = OutputProcessor(tokenizer)
    ranked.add_request(processor.process("q", "Hi", SamplingParams(logprobs=0)))
    outputs, _ = ranked.process_outputs([out("q", [7], logprobs=[{7: (-4.0, 17)}])])
    assert outputs[0].outputs[0].logprobs[0][7].rank == 17


def test_abort_gives_final_output(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, max_tokens=10)
    output_processor.process_outputs([out("r", tokenizer.encode(" world"))])
    aborted = output_processor.abort_requests(["r", "unknown"])
    assert len(aborted) == 1 and aborted[0].finished
    assert aborted[0].outputs[0].finish_reason == "abort" and aborted[0].outputs[0].text == " world"
    assert not output_processor.has_unfinished_requests()


def test_duplicate_request_id_rejected(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer)
    with pytest.raises(ValueError, match="already"):
        output_processor.add_request(processor.process("r", "Hi", SamplingParams()))
    assert output_processor.get_num_unfinished_requests() == 1 and output_processor.has_request("r")


# ------------------------------------------------------------------------------- parallel sampling
def test_fan_out_children(processor):
    request = processor.process("p", "Hello", SamplingParams(n=3, seed=10, temperature=0.8))
    parent, children = fan_out(request)
    assert isinstance(parent, ParentRequest) and parent.n == 3
    assert [c.request_id for c in children] == ["0_p", "1_p", "2_p"]
    assert [c.sampling_params.seed for c in children] == [10, 11, 12]
    assert all(c.sampling_params.n == 1 and c.prompt_token_ids == request.prompt_token_ids for c in children)
    assert request.sampling_params.n == 3 and request.sampling_params.seed == 10
    unseeded = fan_out(processor.process("u", "Hello", SamplingParams(n=2)))[1]
    assert [c.sampling_params.seed for c in unseeded] == [None, None]
    single_parent, single = fan_out(request_n1 := processor.process("s", "Hi", SamplingParams()))
    assert single_parent is None and single == [request_n1]


def test_children_report_under_the_parent_id_one_each(processor, tokenizer):
    """vLLM v0.33.0 (ParentRequest.get_outputs, CUMULATIVE): each child's report is its own RequestOutput under
    the parent's id, holding that child alone (its whole text so far); the parent finishes with its last child."""
    output_processor, child_ids = start(processor, tokenizer, request_id="p", n=2, temperature=1.0)
    assert child_ids == ["0_p", "1_p"] and output_processor.engine_request_ids(["p"]) == child_ids
    a, b = tokenizer.encode(" world"), tokenizer.encode(" fox")
    outputs, _ = output_processor.process_outputs([out("1_p", b[:1]), out("0_p", a[:1])])
    assert [(o.request_id, [c.index for c in o.outputs], o.finished) for o in outputs] == [
        ("p", [1], False), ("p", [0], False)]
    outputs, _ = output_processor.process_outputs([out("1_p", b[1:], "length")])
    assert not outputs[0].finished and outputs[0].outputs[0].finished() and outputs[0].outputs[0].text == " fox"
    (final,), _ = output_processor.process_outputs([out("0_p", a[1:], "length")])
    assert final.finished and [(c.index, c.text) for c in final.outputs] == [(0, " world")]
    assert not output_processor.has_unfinished_requests() and not output_processor.has_request("p")


def test_parent_final_only_and_delta(processor, tokenizer):
    final_only, _ = start(processor, tokenizer, request_id="p", n=2, output_kind=FINAL_ONLY)
    assert final_only.process_outputs([out("0_p", [5], "length")]) == ([], [])
    outputs, _ = final_only.process_outputs([out("1_p", [6], "length")])
    assert outputs[0].finished and [c.token_ids for c in outputs[0].outputs] == [[5], [6]]
    delta, _ = start(processor, tokenizer, request_id="d", n=2, output_kind=DELTA)
    outputs, _ = delta.process_outputs([out("0_d", [5, 6])])
    outputs, _ = delta.process_outputs([out("0_d", [7], "length"), out("1_d", [8])])
    assert [[(c.index, c.token_ids) for c in o.outputs] for o in outputs] == [[(0, [7])], [(1, [8])]]


def test_parent_stop_string_and_abort(processor, tokenizer):
    output_processor, _ = start(processor, tokenizer, request_id="p", n=2, stop=["fox"])
    outputs, to_abort = output_processor.process_outputs([out("0_p", tokenizer.encode(" quick fox"))])
    assert to_abort == ["0_p"] and outputs[0].outputs[0].stop_reason == "fox"
    assert output_processor.engine_request_ids(["p"]) == ["1_p"]
    aborted = output_processor.abort_requests(["p"])   # the child still running, alone
    assert [(o.request_id, o.finished, [(c.index, c.finish_reason) for c in o.outputs]) for o in aborted] == [
        ("p", True, [(1, "abort")])]
    assert not output_processor.has_unfinished_requests()
