"""The detokenizer view: the phase-06 worked example with the shipped tokenizer, replayed exactly as the
engine's detokenizer runs it."""

from __future__ import annotations

import pytest

from labs.views import detokenizer_stream, render_detokenizer_html
from mini.config import SHIPPED_MODEL_DIR
from mini.engine import EngineCoreRequest
from mini.engine.detokenizer import OffsetIncrementalDetokenizer
from mini.sampling_params import SamplingParams
from mini.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(SHIPPED_MODEL_DIR)


def test_worked_example(tokenizer):
    prompt_ids = tokenizer.encode("The cat", add_special_tokens=False)
    output_ids = tokenizer.encode(" sat, café 🙂 世界!", add_special_tokens=False)
    steps = detokenizer_stream(tokenizer, prompt_ids, output_ids)
    assert "".join(s.emitted for s in steps) == " sat, café 🙂 世界!"
    assert b"".join(s.utf8_bytes for s in steps) == " sat, café 🙂 世界!".encode()
    emoji = [s for s in steps if s.utf8_bytes and s.utf8_bytes[0] == 0xF0]
    assert len(emoji) == 1
    start = steps.index(emoji[0])
    assert [s.emitted for s in steps[start : start + 4]] == ["", "", "", "🙂"]
    assert all(s.alone == "\ufffd" for s in steps[start : start + 4])
    html = render_detokenizer_html(steps)
    assert "(wait)" in html and "f0" in html


def test_matches_the_engine_detokenizer(tokenizer):
    prompt_ids = tokenizer.encode("世界 and", add_special_tokens=False)
    output_ids = tokenizer.encode(" 🍕 naïve 日本", add_special_tokens=False)
    request = EngineCoreRequest(
        request_id="r",
        prompt="世界 and",
        prompt_token_ids=prompt_ids,
        sampling_params=SamplingParams(max_tokens=32),
        eos_token_id=None,
        arrival_time=0.0,
    )
    engine_detok = OffsetIncrementalDetokenizer(tokenizer, request)
    pieces = [engine_detok.decode_next(token_id) for token_id in output_ids]
    steps = detokenizer_stream(tokenizer, prompt_ids, output_ids)
    assert [s.emitted for s in steps] == pieces
    assert (steps[-1].prefix_offset, steps[-1].read_offset) == (
        engine_detok.prefix_offset,
        engine_detok.read_offset,
    )
