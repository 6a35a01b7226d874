"""The `detokenizer` role: `detokenize_incrementally` and `check_stop_strings` are chosen when the engine is
built (mini/roles.py); the output processor builds every request's detokenizer from that choice."""

from __future__ import annotations

import pytest

from labs import plug
from mini import LLM, SamplingParams, roles
from mini.config import SHIPPED_MODEL_DIR, EngineConfig
from mini.engine import EngineCoreRequest, detokenizer
from mini.engine.detokenizer import IncrementalDetokenizer, OffsetIncrementalDetokenizer
from mini.engine.output_processor import OutputProcessor

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines
PARTS = ("detokenize_incrementally", "check_stop_strings")


def spying(calls: dict[str, int], part: str):
    reference = roles.reference(part)

    def spy(*args, **kwargs):
        calls[part] = calls.get(part, 0) + 1
        return reference(*args, **kwargs)

    return spy


@pytest.fixture(scope="module")
def tokenizer():
    from mini.tokenizer import load_tokenizer

    return load_tokenizer(SHIPPED_MODEL_DIR)


def request(tokenizer, request_id: str = "r", **params) -> EngineCoreRequest:
    return EngineCoreRequest(request_id=request_id, prompt=None, prompt_token_ids=tokenizer.encode("The cat"),
                             sampling_params=SamplingParams(**params), eos_token_id=None, arrival_time=0.0)


def test_the_references_live_on_the_text_detokenizer():
    for part in PARTS:
        assert roles.home_class(part) is OffsetIncrementalDetokenizer
        assert roles.reference(part) is getattr(detokenizer, part)
    assert roles.resolve(EngineConfig(), OffsetIncrementalDetokenizer) is OffsetIncrementalDetokenizer
    assert OutputProcessor(None).text_detokenizer is OffsetIncrementalDetokenizer


def test_the_output_processor_builds_its_detokenizers_with_the_chosen_parts(tokenizer):
    calls: dict[str, int] = {}
    processor = OutputProcessor(tokenizer, EngineConfig(parts={part: spying(calls, part) for part in PARTS}))
    assert processor.text_detokenizer.__bases__ == (OffsetIncrementalDetokenizer,)
    processor.add_request(request(tokenizer, stop=["zzz"]))
    detok = processor.request_states["r"].detokenizer
    assert isinstance(detok, processor.text_detokenizer)
    detok.update(tokenizer.encode(" sat, café", add_special_tokens=False), stop_terminated=False)
    assert detok.output_text == " sat, café"
    assert calls["detokenize_incrementally"] >= 1 and calls["check_stop_strings"] == 1
    # A request that wants no text gets the id-only detokenizer, whatever the choice.
    processor.add_request(request(tokenizer, "ids", detokenize=False))
    assert type(processor.request_states["ids"].detokenizer) is IncrementalDetokenizer


def test_an_engine_built_inside_plug_detokenizes_with_the_plugged_parts():
    calls: dict[str, int] = {}
    params = SamplingParams(temperature=0.0, max_tokens=8, stop=["\n"])
    expected = LLM(max_model_len=64).generate(["Once upon a time"], params, use_tqdm=False)
    with plug(**{part: spying(calls, part) for part in PARTS}):
        llm = LLM(max_model_len=64)
    assert roles.replaced(llm.llm_engine.config, "detokenizer") == PARTS
    got = llm.generate(["Once upon a time"], params, use_tqdm=False)   # after the block: kept
    assert set(calls) == set(PARTS)
    assert got[0].outputs[0].text == expected[0].outputs[0].text
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
