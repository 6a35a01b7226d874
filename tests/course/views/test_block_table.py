"""The block-table view: its plain-data model matches the engine at every recorded step, and the
widget and the static figure build without a front end."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views import block_table_view, block_table_widget, plot_block_table, record_run
from labs.views.block_table import render_block_table_html, render_block_table_text
from mini import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": ids} for ids in ([1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13])]


def _engine_state(engine) -> dict:
    scheduler = engine.scheduler
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    live = [r.request_id for r in scheduler.requests.values() if not r.is_finished()]
    return {
        "ref_cnts": [b.ref_cnt for b in pool.blocks],
        "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "block_tables": {r: manager.get_block_ids(r) for r in live if manager.get_block_ids(r)},
        "running": [r.request_id for r in scheduler.running],
    }


@pytest.fixture(scope="module")
def small_pool_run(tiny_llama_dir):
    """8 blocks of 4 slots: the three worked-example prompts force a preemption."""
    llm = LLM(
        model=str(tiny_llama_dir),
        skip_tokenizer_init=True,
        block_size=4,
        num_gpu_blocks_override=8,
        max_model_len=64,
    )
    mismatches: list[tuple[int, dict, dict]] = []

    def compare(engine, snapshot) -> None:
        state = _engine_state(engine)
        seen = {
            "ref_cnts": snapshot.ref_cnts,
            "free_queue": snapshot.free_queue,
            "block_tables": snapshot.block_tables,
            "running": snapshot.running,
        }
        if seen != state:
            mismatches.append((snapshot.step, state, seen))

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    recording = record_run(llm, PROMPTS, params, on_step=compare)
    return recording, mismatches


def test_snapshots_match_engine_state_at_every_step(small_pool_run):
    recording, mismatches = small_pool_run
    assert len(recording.snapshots) > 3
    assert mismatches == []


def test_recording_sees_allocation_preemption_and_frees(small_pool_run):
    recording, _ = small_pool_run
    first = recording.snapshots[1]
    assert first.block_tables == {"r0": [1, 2], "r1": [3, 4], "r2": [5]}
    assert any(s.preempted for s in recording.snapshots), "a pool of 8 blocks must preempt someone"
    events = [e for s in recording.snapshots for e in s.events]
    assert any(e.startswith("preempt") for e in events)
    assert any(e.startswith("free") for e in events)
    last = recording.snapshots[-1]
    assert last.block_tables == {}
    assert sorted(last.free_queue) == list(range(1, 8))  # everything back, the null block excepted


def test_view_model_colours_owners_and_free_positions(small_pool_run):
    recording, _ = small_pool_run
    for snapshot in recording.snapshots:
        view = block_table_view(snapshot, recording.request_ids)
        assert [c.block_id for c in view.cells] == list(range(snapshot.num_blocks))
        assert view.cells[0].state == "null"
        for cell in view.cells[1:]:
            assert (cell.state == "free") == (cell.ref_cnt == 0)
            if cell.state == "free":
                assert snapshot.free_queue[cell.free_position] == cell.block_id
            else:
                assert cell.free_position is None
                assert cell.color == view.colors[cell.owners[0]]
        owned = sorted(b for ids in view.block_tables.values() for b in ids)
        assert owned == sorted(c.block_id for c in view.cells if c.state == "used")
        # slot occupancy: each request's blocks hold exactly its computed tokens, the last one partly
        for req_id, ids in view.block_tables.items():
            cells = [view.cells[b] for b in ids]
            assert sum(c.filled for c in cells) == view.num_computed_tokens[req_id], (snapshot.step, req_id)
            assert all(c.filled == view.block_size for c in cells[:-1]) or view.num_computed_tokens[req_id] < (
                len(ids) - 1) * view.block_size
            assert all(c.filled + c.empty == view.block_size for c in cells)
        assert view.empty_slots() == sum(c.empty for c in view.cells)


def test_html_and_static_rendering(small_pool_run):
    recording, _ = small_pool_run
    view = block_table_view(recording.snapshots[1], recording.request_ids)
    text = render_block_table_html(view)
    assert "step 1" in text and "[1, 2]" in text and "free queue" in text
    ax = plot_block_table(view)
    assert len(ax.patches) == recording.snapshots[1].num_blocks
    matplotlib.pyplot.close("all")
    # step 1: r0 computed 5 tokens in blocks [1, 2] -> 4/4 and 1/4 (3 empty slots); the legend names r0
    assert "4/4" in text and "1/4" in text and "bt-legend" in text and "internal fragmentation" in text
    assert text.count('class="bt-slot bt-filled"') == sum(c.filled for c in view.cells)
    plain = render_block_table_text(view)
    assert "block   1 [####] 4/4  owners r0  ref 1" in plain and "block   2 [#...] 1/4  owners r0  ref 1" in plain


def test_widget_builds_and_the_slider_replays_steps(small_pool_run):
    recording, _ = small_pool_run
    box = block_table_widget(recording)
    controls, board = box.children
    slider = controls.children[1]
    assert slider.max == len(recording.snapshots) - 1
    assert "step 0" in board.value
    slider.value = 1
    assert "step 1" in board.value and "[3, 4]" in board.value
    assert len(box.views) == len(recording.snapshots)
    # the text twin: what a front end without widgets shows (text/plain), and any step on demand
    assert box.text().startswith("Text view of the block-table widget (step 1 of 0..")
    assert box._repr_mimebundle_()["text/plain"] == box.text()
    assert "r1: 7 tokens computed, block table [3, 4]" in box.text(1)


def test_shared_blocks_list_every_owner_and_their_ref_count(tiny_llama_dir):
    """Prefix caching: three requests share the first two blocks of one prefix; every owner is listed."""
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=12,
              max_model_len=64, enable_prefix_caching=True)
    prefix = list(range(1, 10))
    prompts = [{"prompt_token_ids": prefix + tail} for tail in ([20], [21, 22], [23])]
    recording = record_run(llm, prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    view = block_table_view(recording.snapshots[1], recording.request_ids)
    shared = [c for c in view.cells if c.state == "shared"]
    assert shared, "the three prompts share a prefix: some block must be shared"
    for cell in shared:
        assert cell.owners == [r for r in recording.request_ids if cell.block_id in view.block_tables[r]]
        assert cell.ref_cnt == len(cell.owners) and cell.filled == view.block_size
        assert cell.owner_colors == tuple(view.colors[r] for r in cell.owners)
    page = render_block_table_html(view)
    assert "repeating-linear-gradient" in page   # stripes: one per owner
    first = shared[0]
    owners = f"<span class='bt-owners'>{','.join(first.owners)}</span>"
    assert f"{owners} <span class='bt-ref'>ref {first.ref_cnt}</span>" in page
    plain = render_block_table_text(view)
    assert f"owners {','.join(first.owners)}  ref {first.ref_cnt}  shared" in plain


def test_without_ipywidgets_the_widget_is_its_text(small_pool_run, monkeypatch):
    import sys

    recording, _ = small_pool_run
    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # `import ipywidgets` raises ImportError
    view = block_table_widget(recording)
    assert repr(view).startswith("Text view of the block-table widget (step 0 of 0..")
    assert "block   1 [####] 4/4  owners r0" in view.text(1) and len(view.views) == len(recording.snapshots)
