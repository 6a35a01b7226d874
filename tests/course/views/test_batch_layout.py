"""The batch-layout view: the phase-02 worked example, consistency with the block tables, and the
recorded engine batches (each step's `StepTrace.inputs`)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views import (
    batch_layout,
    batch_layout_from_inputs,
    batch_layout_widget,
    plot_batch_layout,
    record_run,
    render_batch_layout_html,
)
from mini import LLM, SamplingParams

TOKENS = [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]]
BLOCKS = [[1, 2], [3, 4], [5]]


def test_worked_example_prefill():
    layout = batch_layout(TOKENS, [0, 0, 0], [5, 7, 3], BLOCKS, block_size=4)
    assert [c.slot for c in layout.columns] == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    assert [c.req_id for c in layout.columns] == ["r0"] * 5 + ["r1"] * 7 + ["r2"] * 3
    assert layout.query_start_loc == [0, 5, 12, 15]
    assert layout.seq_lens == [5, 7, 3]
    assert layout.written_slots() == {1: [0, 1, 2, 3], 2: [0], 3: [0, 1, 2, 3], 4: [0, 1, 2], 5: [0, 1, 2]}


def test_worked_example_decode():
    layout = batch_layout([t + [99] for t in TOKENS], [5, 7, 3], [1, 1, 1], BLOCKS, block_size=4)
    assert [c.slot for c in layout.columns] == [9, 19, 23]
    assert [(c.block_id, c.offset) for c in layout.columns] == [(2, 1), (4, 3), (5, 3)]
    assert [c.position for c in layout.columns] == [5, 7, 3]


def _assert_consistent(layout) -> None:
    for column in layout.columns:
        req = layout.req_ids.index(column.req_id)
        assert layout.query_start_loc[req] <= column.row < layout.query_start_loc[req + 1]
        block = layout.block_table[req][column.position // layout.block_size]
        assert (column.block_id, column.offset) == (block, column.position % layout.block_size)
        assert column.slot == column.block_id * layout.block_size + column.offset
        assert column.position < layout.seq_lens[req]


@pytest.fixture(scope="module")
def recording(tiny_llama_dir):
    llm = LLM(
        model=str(tiny_llama_dir),
        skip_tokenizer_init=True,
        block_size=4,
        num_gpu_blocks_override=16,
        max_model_len=64,
    )
    prompts = [{"prompt_token_ids": ids} for ids in TOKENS]
    return record_run(llm, prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))


def test_recorded_batches_are_the_worked_example(recording):
    assert recording.snapshots[1].batch.slot_mapping == [
        4,
        5,
        6,
        7,
        8,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        20,
        21,
        22,
    ]
    assert recording.snapshots[2].batch.slot_mapping == [9, 19, 23]
    assert recording.snapshots[2].batch.positions == [5, 7, 3]


def test_recorded_batches_are_linked_to_the_block_tables(recording):
    for snapshot in recording.snapshots[1:]:
        layout = batch_layout_from_inputs(snapshot.batch, snapshot.block_size, recording.request_ids)
        _assert_consistent(layout)
        for column in layout.columns:  # every written slot is in a block its request holds now
            if column.req_id in snapshot.block_tables:
                assert column.block_id in snapshot.block_tables[column.req_id]


def test_rendering_and_widget(recording):
    layout = batch_layout(TOKENS, [0, 0, 0], [5, 7, 3], BLOCKS, block_size=4)
    text = render_batch_layout_html(layout)
    assert "slot_mapping" in text and "query_start_loc = [0, 5, 12, 15]" in text
    ax = plot_batch_layout(layout)
    assert len(ax.patches) == 5 * 15 + 5 * 4  # 5 aligned rows of 15 tokens + 5 blocks of 4 slots
    matplotlib.pyplot.close("all")
    box = batch_layout_widget(recording)
    slider, board = box.children
    assert "[0, 5, 12, 15]" in board.value
    slider.value = 2
    assert "query_start_loc = [0, 1, 2, 3]" in board.value
    # the text twin follows the slider; any step can be printed
    assert box.text().startswith("Text view of the batch-layout widget (step 2 of 1..")
    assert "query_start_loc = [0, 1, 2, 3]" in box.text() and "[0, 5, 12, 15]" in box.text(1)
    assert box._repr_mimebundle_()["text/plain"] == box.text()
