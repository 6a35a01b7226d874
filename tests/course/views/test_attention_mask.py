"""The attention-mask view: the phase-03 worked example, agreement with the reference paged attention
(dense attention over the whole flattened cache with the view's mask gives the same output), and the
mixed batches of a real chunked-prefill engine run."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from labs.views import attention_mask_from_batch, attention_mask_view, plot_attention_mask, record_run
from mini import LLM, SamplingParams
from mini.attention import reference
from mini.attention.reference import AttentionMetadata
from mini.worker import prepare_inputs as prep

# phase 03's worked example: r0 a prefill chunk (6 cached + 4 new), r1 and r2 decodes; block_size 4
BLOCKS = [[7, 2, 5], [1, 4], [6]]
COMPUTED, SCHEDULED = [6, 5, 2], [4, 1, 1]


def test_worked_example():
    view = attention_mask_view(
        [0, 4, 5, 6], [10, 6, 3], prep.make_block_table(BLOCKS), block_size=4, num_blocks=8
    )
    assert [(r.req_id, r.position, r.slot) for r in view.rows] == [
        ("r0", 6, 10),
        ("r0", 7, 11),
        ("r0", 8, 20),
        ("r0", 9, 21),
        ("r1", 5, 17),
        ("r2", 2, 26),
    ]
    assert view.rows[0].attended_slots == [28, 29, 30, 31, 8, 9, 10]  # block 7, then block 2 up to offset 2
    assert view.rows[4].attended_slots == [4, 5, 6, 7, 16, 17]
    assert view.rows[5].attended_slots == [24, 25, 26]
    assert view.blocks_in_use() == [1, 2, 4, 5, 6, 7]
    assert [view.kind(r) for r in view.req_ids] == ["prefill chunk", "decode", "decode"]
    assert sum(map(sum, view.dense())) == 7 + 8 + 9 + 10 + 6 + 3


def _metadata(block_ids, computed, scheduled, block_size) -> AttentionMetadata:
    inputs = prep.prepare_inputs(
        [list(range(c + s)) for c, s in zip(computed, scheduled,
                                            strict=False)], computed, scheduled, block_ids, block_size
    )
    return AttentionMetadata(
        len(inputs.input_ids),
        inputs.query_start_loc,
        inputs.seq_lens,
        inputs.block_table,
        inputs.slot_mapping,
        max(scheduled),
        int(inputs.seq_lens.max()),
    )


@pytest.mark.parametrize("seed", range(5))
def test_mask_is_the_reference_attention(seed):
    """Dense attention over ALL cache slots, masked by the view, equals mini's paged attention."""
    generator = torch.Generator().manual_seed(seed)
    block_size, num_blocks, heads, kv_heads, dim = 4, 8, 4, 2, 8
    meta = (
        _metadata(BLOCKS, COMPUTED, SCHEDULED, block_size)
        if seed == 0
        else _metadata([[3, 1], [6, 2, 5], [7]], [1, 0, 3], [1, 9, 1], block_size)
    )
    kv_cache = torch.randn(2, num_blocks, block_size, kv_heads, dim, generator=generator)
    query = torch.randn(meta.num_actual_tokens, heads, dim, generator=generator)
    expected = reference.paged_attention(query, kv_cache, meta, dim**-0.5)

    view = attention_mask_view(meta.query_start_loc, meta.seq_lens, meta.block_table, block_size, num_blocks)
    mask = torch.tensor(view.dense())  # [T, num_slots]
    keys = kv_cache[0].flatten(0, 1).repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)  # [H, S, D]
    values = kv_cache[1].flatten(0, 1).repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    dense = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1), keys, values, attn_mask=mask, scale=dim**-0.5
    )
    torch.testing.assert_close(dense.transpose(0, 1), expected, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def recording(tiny_llama_dir):
    llm = LLM(
        model=str(tiny_llama_dir),
        skip_tokenizer_init=True,
        block_size=4,
        num_gpu_blocks_override=16,
        max_model_len=64,
        max_num_batched_tokens=8,
    )
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 2, 3], list(range(10, 20)), [30, 31, 32, 33])]
    return record_run(llm, prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))


def test_recorded_mixed_batch(recording):
    step2 = recording.snapshots[2]  # r0 decodes, r1 finishes its prompt (chunk 2), r2 starts (2 of 4)
    view = attention_mask_from_batch(step2.batch, step2.block_size, step2.num_blocks, recording.request_ids)
    assert [view.kind(r) for r in view.req_ids] == ["decode", "prefill chunk", "prefill"]
    assert [r.position for r in view.rows] == [3, 5, 6, 7, 8, 9, 0, 1]
    for snapshot in recording.snapshots[1:]:
        view = attention_mask_from_batch(snapshot.batch, snapshot.block_size, snapshot.num_blocks)
        assert [r.slot for r in view.rows] == snapshot.batch.slot_mapping  # own slot = where K/V is written
        assert [r.position for r in view.rows] == snapshot.batch.positions
        for row in view.rows:  # everything read lies in blocks the request holds
            held = snapshot.batch.block_table[view.req_ids.index(row.req_id)]
            assert {slot // snapshot.block_size for slot in row.attended_slots} <= set(held)
            assert len(row.attended_slots) == row.position + 1


def test_plot():
    view = attention_mask_view([0, 4, 5, 6], [10, 6, 3], BLOCKS, block_size=4, num_blocks=8)
    ax = plot_attention_mask(view)
    assert len(ax.patches) == 6 * 6 * 4  # 6 query rows x 6 blocks in use x 4 slots
    matplotlib.pyplot.close("all")
