"""mini.attention.reference: store_kv by slot, paged attention == SDPA on the gathered contiguous K/V."""

from __future__ import annotations

import pytest
import torch

from mini.attention import build_attention_backend
from mini.attention import reference as attn
from mini.worker.prepare_inputs import prepare_inputs

HEAD_SIZE = 8
NUM_KV_HEADS = 2


def build_case(seq_lens, query_lens, block_size, num_heads, seed=0, num_blocks=64):
    """Random K/V/Q for a batch; blocks handed out shuffled so the table is really non-contiguous."""
    gen = torch.Generator().manual_seed(seed)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_ids = []
    for seq_len in seq_lens:
        count = -(-seq_len // block_size)
        block_ids.append(perm[:count])
        perm = perm[count:]
    tokens = [list(range(n)) for n in seq_lens]
    computed = [n - q for n, q in zip(seq_lens, query_lens, strict=False)]
    everything = prepare_inputs(tokens, [0] * len(seq_lens), list(seq_lens), block_ids, block_size)
    inputs = prepare_inputs(tokens, computed, list(query_lens), block_ids, block_size)
    total = sum(seq_lens)
    keys = torch.randn(total, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    values = torch.randn(total, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    query = torch.randn(sum(query_lens), num_heads, HEAD_SIZE, generator=gen)
    kv_cache = torch.zeros(2, num_blocks, block_size, NUM_KV_HEADS, HEAD_SIZE)
    attn.store_kv(keys, values, kv_cache, everything.slot_mapping)
    metadata = attn.AttentionMetadata(
        num_actual_tokens=sum(query_lens), query_start_loc=inputs.query_start_loc, seq_lens=inputs.seq_lens,
        block_table=inputs.block_table, slot_mapping=inputs.slot_mapping,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
    )
    return query, keys, values, kv_cache, metadata, everything.query_start_loc.tolist()


def sdpa_reference(query, keys, values, seq_lens, query_lens, kv_starts, scale):
    outs = []
    q_start = 0
    for seq_len, q_len, kv_start in zip(seq_lens, query_lens, kv_starts, strict=False):
        q = query[q_start:q_start + q_len].transpose(0, 1)  # [H, q, D]
        group = q.shape[0] // NUM_KV_HEADS
        k = keys[kv_start:kv_start + seq_len].transpose(0, 1).repeat_interleave(group, 0)
        v = values[kv_start:kv_start + seq_len].transpose(0, 1).repeat_interleave(group, 0)
        # causal with the queries being the LAST q_len positions
        mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
                    .transpose(0, 1))
        q_start += q_len
    return torch.cat(outs)


CASES = {
    "prefill-ragged": ([5, 1, 8, 16, 3], [5, 1, 8, 16, 3]),
    "decode-only": ([6, 1, 9, 16, 17], [1, 1, 1, 1, 1]),
    "chunked-and-mixed": ([12, 7, 4, 33], [4, 1, 4, 10]),
}


@pytest.mark.parametrize("num_heads", [2, 4, 8])  # GQA group sizes 1, 2, 4
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_matches_sdpa(case, block_size, num_heads):
    seq_lens, query_lens = CASES[case]
    query, keys, values, kv_cache, metadata, kv_starts = build_case(seq_lens, query_lens, block_size, num_heads)
    scale = HEAD_SIZE**-0.5
    got = attn.paged_attention(query, kv_cache, metadata, scale)
    expected = sdpa_reference(query, keys, values, seq_lens, query_lens, kv_starts, scale)
    assert got.shape == query.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_store_kv_writes_block_and_offset_and_skips_padding():
    kv_cache = torch.zeros(2, 4, 4, 1, 2)
    key = torch.arange(6, dtype=torch.float32).view(3, 1, 2) + 1
    value = -key
    attn.store_kv(key, value, kv_cache, torch.tensor([5, -1, 14]))
    assert kv_cache[0, 1, 1].tolist() == [[1.0, 2.0]]  # slot 5 -> block 1, offset 1
    assert kv_cache[1, 3, 2].tolist() == [[-5.0, -6.0]]  # slot 14 -> block 3, offset 2
    assert int((kv_cache != 0).sum()) == 8  # only two slots written: the -1 row went nowhere


def test_reduced_precision_inputs_are_computed_in_float32():
    query, _, _, kv_cache, metadata, _ = build_case([9, 4], [9, 1], 4, 4)
    expected = attn.paged_attention(query, kv_cache, metadata, 0.3)
    got = attn.paged_attention(query.bfloat16(), kv_cache.bfloat16(), metadata, 0.3)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)


def test_backend_selection():
    backend = build_attention_backend("torch")
    assert type(backend) is attn.ReferenceAttentionBackend and backend.name == "torch"
    assert build_attention_backend(backend) is backend  # an instance is shared as it is
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        build_attention_backend("flash")
