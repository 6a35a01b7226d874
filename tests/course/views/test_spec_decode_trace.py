"""The speculative-decoding trace: a recorded n-gram run of a real engine, its verdicts, and the widget."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views.spec_decode_trace import (
    classify,
    plot_acceptance_histogram,
    record_spec_decode,
    render_output_html,
    spec_decode_widget,
    token_origins,
)
from mini import LLM, SamplingParams
from mini.sampling_params import RequestOutputKind

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = [{"prompt_token_ids": [5, 6, 7, 8] * 4}, {"prompt_token_ids": [20, 21, 22, 20, 21, 22, 20]}]


@pytest.fixture(scope="module")
def recorded(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, num_gpu_blocks_override=32,
              speculative_config=NGRAM)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, num_gpu_blocks_override=32)
    expected = [out.outputs[0].token_ids for out in plain.generate(PROMPTS, params, use_tqdm=False)]
    delta = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    return record_spec_decode(llm, PROMPTS, delta), expected


def test_classify_reads_accepted_recovered_bonus_from_the_tokens():
    assert classify([4, 5, 6], [4, 9]) == (1, "recovered")
    assert classify([4, 5, 6], [4, 5, 6, 7]) == (3, "bonus")
    assert classify([4, 5, 6], [9]) == (0, "recovered")
    assert classify([], [9]) == (0, "plain")
    assert classify([4, 5, 6], [4, 5]) == (2, "stopped")     # max_tokens cut the accepted run
    assert classify([], []) == (0, "none")


def test_recording_matches_the_engine(recorded):
    recording, expected = recorded
    assert recording.request_ids == ["r0", "r1"] and recording.num_speculative_tokens == 3
    assert recording.method == "ngram"
    # greedy speculation is exact: the same tokens as the engine without it
    assert [recording.output_token_ids[req_id] for req_id in recording.request_ids] == expected
    first = recording.steps[0]
    assert [(row.kind, row.num_scheduled_tokens) for row in first.requests] == [("plain", 16), ("plain", 7)]
    verified = [row for step in recording.steps for row in step.requests if row.drafts]
    assert verified, "the repeated prompts give n-gram drafts"
    for row in verified:
        assert row.num_scheduled_tokens == 1 + len(row.drafts)
        assert row.emitted[:row.num_accepted] == row.drafts[:row.num_accepted]
        assert 1 <= len(row.emitted) <= len(row.drafts) + 1
    # the running histogram counts exactly the engine's drafts and accepted tokens
    last = recording.steps[-1]
    counters = last.engine_counters
    assert sum(last.acceptance_counts) == counters["num_drafts"] == len(verified)
    assert sum(row.num_accepted for row in verified) == counters["num_accepted_tokens"]
    assert sum(len(row.drafts) for row in verified) == counters["num_draft_tokens"]
    assert recording.tokens_per_pass() > 1.0 or counters["num_accepted_tokens"] == 0
    origins = token_origins(recording, "r0")
    assert [token for token, _ in origins] == recording.output_token_ids["r0"]
    assert "accepted" in render_output_html(recording, "r0")


def test_widget_redraws_for_the_chosen_step(recorded):
    recording, _ = recorded
    widget = spec_decode_widget(recording)
    (play, slider), (board, _histogram) = widget.children[0].children, widget.children[1].children
    assert len(widget.pages) == len(recording) and slider.min == 1 and slider.max == len(recording)
    # jslink copies the play button's value into the slider in the browser: all three start on one step
    assert play.value == slider.value == 1 and board.value == widget.pages[0]
    assert widget.histogram_shown["step"] == 1
    assert "step 1</b>" in board.value
    drafted = next(index for index, step in enumerate(recording.steps) if any(r.drafts for r in step.requests))
    slider.value = drafted + 1
    assert board.value == widget.pages[drafted] != widget.pages[0]
    assert f"step {drafted + 1}</b>" in board.value and "accepted" in board.value
    assert widget.histogram_shown == {"step": drafted + 1,
                                      "acceptance_counts": recording.steps[drafted].acceptance_counts}
    text = widget.text()
    assert text.startswith(f"Text view of the spec-decode widget (step {drafted + 1} of 1..") and "accepted" in text
    assert f"produced 1, 2, 3, ... tokens): {recording.steps[drafted].acceptance_counts}" in text
    assert sum(recording.steps[drafted].acceptance_counts) >= 1
    # the histogram's bars are the running counts of the step shown
    ax = plot_acceptance_histogram(recording, len(recording) - 1)
    assert [int(bar.get_height()) for bar in ax.patches] == recording.steps[-1].acceptance_counts
    ax = plot_acceptance_histogram(recording, 0)
    assert sum(int(bar.get_height()) for bar in ax.patches) == 0
