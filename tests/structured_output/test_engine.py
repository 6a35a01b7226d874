"""Structured output in the engine: the shipped model, sampling on, every output in its language.

Also: WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR while the grammar compiles, a mixed constrained/unconstrained
batch with chunked prefill and preemption, dead ends, abort, and bad inputs refused at add_request with nothing changed.
"""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.config import SHIPPED_MODEL_DIR
from mini.core.request import RequestStatus
from mini.sampling_params import StructuredOutputsParams
from mini.structured_output.token_index import TokenTrie

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines

REGEX = r"\d{3}-[a-z]{2,4}( [A-Z][a-z]{0,4}){0,2}"
CHOICES = ["yes", "no", "maybe later", "日本"]
# Every string of this schema is short (bounded lengths, no free integer whose digits could run on), so
# a sampled output always ends well before max_tokens and must then validate.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "zip": {"type": "string", "pattern": "[0-9]{5}"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "kind": {"anyOf": [{"type": "null"}, {"enum": ["x", 7]}]},
    },
    "required": ["name", "zip"],
}


@pytest.fixture(scope="module")
def llm():
    return LLM()


def constrained(seed: int, max_tokens: int = 64, **kind) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(**kind))


def test_sampled_outputs_always_match_regex_choice_and_schema(llm):
    kinds = [{"regex": REGEX}, {"choice": CHOICES}, {"json": SCHEMA}]
    params = [constrained(seed, max_tokens=96, **kind) for kind in kinds for seed in range(3)]
    params.append(constrained(3, max_tokens=96, json=json.dumps(SCHEMA)))  # the schema as JSON text
    outputs = llm.generate(["The answer is"] * len(params), params, use_tqdm=False)
    for param, output in zip(params, outputs, strict=False):
        completion = output.outputs[0]
        spec = param.structured_outputs
        assert completion.finish_reason == "stop", (spec, completion.text)
        if spec.regex is not None:
            assert re.fullmatch(REGEX, completion.text), completion.text
        elif spec.choice is not None:
            assert completion.text in CHOICES
        else:
            jsonschema.validate(json.loads(completion.text), SCHEMA)
    # sampling really varies: the seeds do not all give the same JSON
    assert len({o.outputs[0].text for o in outputs[6:9]}) > 1


def test_json_object_outputs_parse_as_json(llm):
    params = [constrained(seed, max_tokens=64, json_object=True) for seed in range(2)]
    for output in llm.generate(["{"] * 2, params, use_tqdm=False):
        if output.outputs[0].finish_reason == "stop":  # a long string may hit max_tokens first
            json.loads(output.outputs[0].text)
        else:
            assert output.outputs[0].finish_reason == "length"


def test_grammar_compiles_off_the_step_loop_and_the_request_waits_for_fsm(llm):
    engine = llm.llm_engine
    backend = engine.structured_output_manager.backend
    release = threading.Event()
    original = backend.compile_grammar

    def slow_compile(kind, spec):
        release.wait(timeout=HANG_GUARD_S)
        return original(kind, spec)

    backend.compile_grammar = slow_compile
    try:
        engine.add_request("fsm", "Hi", constrained(0, regex="[a-c]{2}"))
        engine.add_request("free", "Hi", SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        request = engine.scheduler.requests["fsm"]
        assert request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        traces = []
        remove_observer = engine.add_step_observer(traces.append)
        engine.step()
        remove_observer()
        assert set(traces[0].scheduler_output.num_scheduled_tokens) == {"free"}  # skipped, not blocking
        assert request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        release.set()
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out
    finally:
        backend.compile_grammar = original
        release.set()
    assert re.fullmatch("[a-c]{2}", outputs["fsm"].outputs[0].text)
    assert len(outputs["free"].outputs[0].token_ids) == 3


def _run(engine, requests):
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    outputs, partial = {}, []
    remove_observer = engine.add_step_observer(
        lambda trace: partial.append(bool(trace.scheduler_output.partial_prefill_req_ids)))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0]
    remove_observer()
    return outputs, any(partial)


def test_mixed_batch_with_chunked_prefill_and_preemption():
    llm = LLM(block_size=4, num_gpu_blocks_override=24, max_num_batched_tokens=24, max_num_seqs=6)
    engine = llm.llm_engine
    long_prompt = "Once upon a time, in a land far away, there lived a curious engineer who " * 2
    greedy_free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    greedy_json = SamplingParams(temperature=0.0, max_tokens=96,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    requests = [("free0", long_prompt, greedy_free), ("json0", long_prompt, greedy_json),
                ("regex1", "Call me at", constrained(1, regex=REGEX)),
                ("free1", "def main():", SamplingParams(temperature=1.0, seed=5, max_tokens=16)),
                ("choice2", "Yes or no?", constrained(2, choice=CHOICES)),
                ("json3", "Data:", constrained(3, max_tokens=96, json=SCHEMA))]
    outputs, saw_partial = _run(engine, requests)
    assert saw_partial, "expected a chunked prefill"
    assert engine.scheduler.num_preemptions_total > 0, "expected a preemption"
    assert re.fullmatch(REGEX, outputs["regex1"].text)
    assert outputs["choice2"].text in CHOICES
    for name in ("json0", "json3"):
        jsonschema.validate(json.loads(outputs[name].text), SCHEMA)

    # The same greedy requests alone, with room to spare: identical tokens. Unconstrained rows were
    # untouched by the masks, and the preempted FSM resumed from its accepted tokens.
    roomy = LLM(block_size=4, max_num_batched_tokens=512).llm_engine
    alone, _ = _run(roomy, [("free0", long_prompt, greedy_free), ("json0", long_prompt, greedy_json)])
    assert outputs["free0"].token_ids == alone["free0"].token_ids
    assert outputs["json0"].token_ids == alone["json0"].token_ids


def test_dead_end_finishes_with_a_clear_reason(llm):
    engine = llm.llm_engine
    backend = engine.structured_output_manager.backend
    trie = backend.trie
    # A vocabulary that cannot spell "z": after "a" the grammar "az" has no live token.
    strings = [None if data and b"z" in data else data for data in trie.byte_strings]
    backend._trie, backend._cache = TokenTrie.build(strings), {}
    try:
        out = llm.generate("x", constrained(0, regex="az"), use_tqdm=False)[0].outputs[0]
    finally:
        backend._trie, backend._cache = trie, {}
    assert out.text == "a"
    assert out.finish_reason == "error"
    assert "no token can continue" in str(out.stop_reason)


def test_failed_compile_finishes_the_request_not_the_engine(llm):
    engine = llm.llm_engine
    backend = engine.structured_output_manager.backend
    original = backend.compile_grammar

    def broken(kind, spec):
        raise ValueError("grammar is too large")

    backend.compile_grammar = broken
    try:
        outs = llm.generate(["x", "y"], [constrained(0, regex="[ab]+"),
                                         SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)],
                            use_tqdm=False)
    finally:
        backend.compile_grammar = original
    assert outs[0].outputs[0].finish_reason == "error" and outs[0].outputs[0].token_ids == []
    assert "too large" in str(outs[0].outputs[0].stop_reason)
    assert len(outs[1].outputs[0].token_ids) == 4


def test_abort_a_waiting_and_a_running_constrained_request(llm):
    engine = llm.llm_engine
    engine.add_request("a", "Hi", constrained(0, max_tokens=50, regex="[a-z]{40}"))
    engine.add_request("b", "Hi", constrained(1, max_tokens=50, choice=CHOICES))
    engine.abort_request(["b"])  # still WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR or WAITING
    for _ in range(3):
        engine.step()
    engine.abort_request(["a"])
    finals = [out for out in engine.step() if out.finished]
    assert {out.request_id for out in finals} >= {"a"}
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == \
        engine.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1


@pytest.mark.parametrize("kind, message", [
    ({"regex": "(ab"}, "structured_outputs.regex"),
    ({"regex": r"(?=a)b"}, "look-around"),
    ({"json": {"type": "string", "format": "email"}}, "format"),
    ({"json": {"type": "array", "minItems": 2, "maxItems": 1}}, "admits no array"),
    ({"json": "{oops"}, "not valid JSON"),
    ({"regex": r"[^\x00-\U0010ffff]"}, "admits no string"),
])
def test_bad_specs_raise_at_add_request_and_change_nothing(llm, kind, message):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="structured_outputs") as info:
        engine.add_request("bad", "Hi", constrained(0, **kind))
    assert message in str(info.value)
    assert not engine.has_unfinished_requests()
    assert "bad" not in engine.scheduler.requests and not engine.output_processor.has_request("bad")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one"), ({"regex": "a", "choice": ["a"]}, "exactly one"), ({"choice": []}, "choice"),
    ({"json_object": "yes"}, "json_object"), ({"regex": 3}, "regex"), ({"json": 3}, "json"),
])
def test_bad_structured_outputs_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})


def test_ignore_eos_and_n_greater_than_one(llm):
    # With ignore_eos the FSM still ends the request once it has taken EOS (the output is complete).
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True, n=2,
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    [output] = llm.generate("Pick:", params, use_tqdm=False)
    assert len(output.outputs) == 2
    for completion in output.outputs:
        assert completion.finish_reason == "stop" and completion.text in CHOICES
