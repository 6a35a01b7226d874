"""Phase 03's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

STORE_LOOP_NO_SKIP = '''
def store_kv(key, value, kv_cache, slot_mapping):
    block_size = kv_cache.shape[2]
    for t, slot in enumerate(slot_mapping.tolist()):
        kv_cache[0, slot // block_size, slot % block_size] = key[t]
        kv_cache[1, slot // block_size, slot % block_size] = value[t]
'''

STORE_RETURNS_COPY = '''
def store_kv(key, value, kv_cache, slot_mapping):
    kv_cache = kv_cache.clone()
    block_size = kv_cache.shape[2]
    is_real = slot_mapping >= 0
    slots = slot_mapping[is_real]
    kv_cache[0, slots // block_size, slots % block_size] = key[is_real].to(kv_cache.dtype)
    kv_cache[1, slots // block_size, slots % block_size] = value[is_real].to(kv_cache.dtype)
    return kv_cache
'''

WRONG = [
    Wrong("store_kv", "slot -1 not skipped", source=STORE_LOOP_NO_SKIP, expect="store_kv: the cached"),
    Wrong("store_kv", "writes a copy and returns it", source=STORE_RETURNS_COPY, expect="return value"),
    Wrong("store_kv", "block and offset swapped",
          edit=("blocks, offsets = slots // block_size, slots % block_size",
                "offsets, blocks = slots // block_size, slots % block_size"),
          expect="store_kv"),
    Wrong("gather_kv", "whole blocks, not cut at seq_len",
          edit=(".flatten(0, 1)[:seq_len]", ".flatten(0, 1)"), expect="gather_kv shape"),
    Wrong("gather_kv", "floor instead of ceil for the number of blocks",
          edit=("num_blocks = -(-seq_len // block_size)", "num_blocks = seq_len // block_size"),
          expect="gather_kv shape"),
    Wrong("gather_kv", "blocks in sorted order",
          edit=("cache_side[block_ids[:num_blocks].long()]", "cache_side[block_ids[:num_blocks].long().sort().values]"),
          expect="gather_kv: token positions with the wrong K/V"),
    Wrong("paged_attention", "causal mask without the offset of the cached tokens",
          edit=("query_positions = torch.arange(seq_len - (end - start), seq_len)",
                "query_positions = torch.arange(0, end - start)"),
          expect="paged_attention: flat query rows that differ"),
    Wrong("paged_attention", "GQA heads interleaved (h % num_kv_heads)",
          edit=(".float().repeat_interleave(group, dim=1)\n        values",
                ".float().repeat(1, group, 1)\n        values"),
          expect="paged_attention: flat query rows that differ"),
    Wrong("paged_attention", "no causal mask", edit=("scores.masked_fill(in_future, float(\"-inf\"))", "scores"),
          expect="paged_attention: flat query rows that differ"),
    Wrong("paged_attention", "returns float32 for a half-precision query",
          edit=("output = torch.zeros_like(query)", "output = torch.zeros_like(query, dtype=torch.float32)"),
          expect="dtype"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("03_paged_attention", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
