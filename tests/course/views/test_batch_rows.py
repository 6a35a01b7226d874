"""The batch-rows view: replaying a BatchUpdate (removes -> adds -> moves) reproduces the persistent batch,
from hand-made updates, from an InputBatch driven directly and from a real engine run."""

from __future__ import annotations

import random

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views import (
    batch_rows_widget,
    plot_batch_rows,
    record_batch_updates,
    record_input_batch,
    recording_from_updates,
    render_batch_rows_html,
    replay_batch_update,
)
from mini import LLM, SamplingParams
from mini.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

UNI, SWAP = MoveDirectionality.UNIDIRECTIONAL, MoveDirectionality.SWAP


def _added(*rows: int) -> list:
    return [(row, SamplingParams(), [0], []) for row in rows]


def test_worked_example_replace_remove_condense():
    # rows [A, B, C, D]; A and C finish, E arrives: E replaces A, row 2 is removed, D condenses into it
    step = replay_batch_update(["A", "B", "C", "D"], BatchUpdate(3, [2], _added(0), [(3, 2, UNI)]), ["E"])
    assert [label for label, _ in step.stages] == ["removes [2]", "adds [0]", "move 3 -> 2"]
    assert step.stages[0][1] == ["A", "B", None, "D"]
    assert step.stages[1][1] == ["E", "B", None, "D"]
    assert step.after == ["E", "B", "D"]
    assert [(e.kind, e.row, e.req_id, e.from_row) for e in step.events] == [
        ("removed", 2, "C", None),
        ("replaced", 0, "E", None),
        ("moved", 2, "D", 3),
    ]


def test_append_and_swap():
    step = replay_batch_update(["A", "B"], BatchUpdate(3, [], _added(2), [(0, 2, SWAP)]), ["C"])
    assert step.after == ["C", "B", "A"]
    assert {(e.kind, e.row, e.req_id) for e in step.events} == {
        ("added", 2, "C"),
        ("swapped", 2, "A"),
        ("swapped", 0, "C"),
    }


def test_hand_written_updates_with_a_backend_swap():
    # [A, B, C, D]: B and C finish, E arrives -> E replaces B, D condenses into row 2, then rows 0 and 1 swap
    recording = recording_from_updates(
        ["A", "B", "C", "D"],
        [(BatchUpdate(3, [2], _added(1), [(3, 2, UNI), (0, 1, SWAP)]), ["E"]), (None, [])],
    )
    assert [label for label, _ in recording.steps[0].stages] == [
        "removes [2]",
        "adds [1]",
        "move 3 -> 2",
        "swap 0 <-> 1",
    ]
    assert recording.steps[0].after == ["E", "A", "D"] and recording.steps[1].after == ["E", "A", "D"]
    assert recording.request_ids == ["A", "B", "C", "D", "E"]


def test_none_means_no_change():
    step = replay_batch_update(["A"], None, [])
    assert not step.changed and step.after == ["A"] and step.events == []
    assert "update_state(None)" in render_batch_rows_html(step)


def test_inconsistent_updates_are_rejected():
    with pytest.raises(ValueError, match="added_ids"):
        replay_batch_update(["A"], BatchUpdate(2, [], _added(1), []), [])
    with pytest.raises(ValueError, match="batch_size"):
        replay_batch_update(["A", "B"], BatchUpdate(5, [], [], []), [])


def test_input_batch_follows_the_documented_rules():
    recording = record_input_batch(
        [([], ["A", "B", "C", "D"]), (["A", "C"], ["E"]), (["B"], ["F", "G", "H"]), (["E", "F", "G"], [])]
    )
    assert [s.after for s in recording.steps] == [
        ["A", "B", "C", "D"],
        ["E", "B", "D"],
        ["E", "F", "D", "G", "H"],
        ["H", "D"],
    ]
    last = recording.steps[-1]
    # E, F, G leave rows 0, 1, 3: H (row 4) moves into row 0, then trailing holes go away
    assert last.removed == [0, 1, 3]
    assert last.moved == [(4, 0, "UNIDIRECTIONAL"), (2, 1, "UNIDIRECTIONAL")]


def test_random_input_batch_runs_replay_exactly():
    rng = random.Random(0)
    live: list[str] = []
    steps = []
    for index in range(50):
        finished = [r for r in live if rng.random() < 0.3]
        new = [f"r{index}_{i}" for i in range(rng.randint(0, 3))]
        live = [r for r in live if r not in finished] + new
        steps.append((finished, new))
    recording = record_input_batch(steps)  # raises if a replay disagrees with the InputBatch
    assert len(recording) == 50
    assert all(None not in s.after for s in recording.steps)  # condensed after every step
    assert [s.after for s in recording.steps][-1] == [r for r in recording.steps[-1].after if r in live]


@pytest.fixture(scope="module")
def engine_recording(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, max_num_seqs=4, max_model_len=64)

    def params(n):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    arrivals = [
        (0, {"prompt_token_ids": [1, 2, 3]}, params(3)),
        (0, {"prompt_token_ids": [4, 5]}, params(6)),
        (0, {"prompt_token_ids": [6, 7, 8]}, params(2)),
        (0, {"prompt_token_ids": [9]}, params(7)),
        (2, {"prompt_token_ids": [1, 5]}, params(4)),
        (3, {"prompt_token_ids": [2, 6]}, params(3)),
        (3, {"prompt_token_ids": [3, 7]}, params(5)),
        (4, {"prompt_token_ids": [3, 9]}, params(2)),
    ]
    return record_batch_updates(llm, arrivals)


def test_engine_run_replays_and_shows_every_kind_of_change(engine_recording):
    kinds = {event.kind for step in engine_recording.steps for event in step.events}
    assert {"added", "replaced", "removed", "moved"} <= kinds
    assert engine_recording.steps[0].after == ["r0", "r1", "r2", "r3"]
    assert len(engine_recording.steps[-1].after) <= 1  # the last request leaves in a step that never runs
    every_request = {req_id for step in engine_recording.steps for _, req_id in step.added}
    assert every_request == {f"r{i}" for i in range(8)}
    for before, after in zip(engine_recording.steps, engine_recording.steps[1:], strict=False):
        assert after.before == before.after


def test_views_render(engine_recording):
    step = next(s for s in engine_recording.steps if s.moved)
    text = render_batch_rows_html(step, engine_recording.request_ids)
    assert "move" in text and "hole" in text
    ax = plot_batch_rows(engine_recording)
    assert ax.get_title(loc="left").startswith("persistent batch rows")
    widget = batch_rows_widget(engine_recording)
    slider, board = widget.children
    slider.value = engine_recording.steps.index(step)
    assert board.value == text
    assert widget.text().startswith("Text view of the batch-rows widget") and "move" in widget.text()
    assert widget._repr_mimebundle_()["text/plain"] == widget.text()
