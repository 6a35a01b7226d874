"""Phase 03's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

STORE_LOOP_NO_SKIP = '''
def store_kv(key, value, kv_cache, slot_mapping):
    block_size = kv_cache.shape[2]
    for t, slot in enumerate(slot_mapping.tolist()):
        kv_cache[0, slot // block_size, slot % block_size] = key[t]
        kv_cache[1, slot // block_size, slot % block_size] = value[t]
'''

STORE_LOOP_STOPS_AT_PAD = '''
def store_kv(key, value, kv_cache, slot_mapping):
    block_size = kv_cache.shape[2]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            break  # "the padding starts here"
        kv_cache[0, slot // block_size, slot % block_size] = key[t]
        kv_cache[1, slot // block_size, slot % block_size] = value[t]
'''

STORE_PADS_INTO_NULL_BLOCK = '''
def store_kv(key, value, kv_cache, slot_mapping):
    block_size = kv_cache.shape[2]
    slots = slot_mapping.clamp(min=0)  # padding rows go to the null block, which nobody reads
    kv_cache[0, slots // block_size, slots % block_size] = key[: len(slots)].to(kv_cache.dtype)
    kv_cache[1, slots // block_size, slots % block_size] = value[: len(slots)].to(kv_cache.dtype)
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

GATHER_LOOP_SWAPPED = '''
def gather_kv(cache_side, block_ids, seq_len):
    block_size = cache_side.shape[1]
    rows = [cache_side[int(block_ids[p % block_size]), p // block_size] for p in range(seq_len)]
    return torch.stack(rows)
'''

ATTENTION_NO_UPCAST = '''
def paged_attention(query, kv_cache, metadata, scale):
    output = torch.zeros_like(query)
    group = query.shape[1] // kv_cache.shape[3]
    starts = metadata.query_start_loc.tolist()
    for req, seq_len in enumerate(metadata.seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        keys = gather_kv(kv_cache[0], metadata.block_table[req], seq_len).repeat_interleave(group, dim=1)
        values = gather_kv(kv_cache[1], metadata.block_table[req], seq_len).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end], keys) * scale
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        in_future = torch.arange(seq_len)[None, :] > query_positions[:, None]
        probs = scores.masked_fill(in_future, float("-inf")).softmax(dim=-1)
        output[start:end] = torch.einsum("hqk,khd->qhd", probs, values)
    return output
'''

ATTENTION_GQA_INTERLEAVED = """
def paged_attention(query, kv_cache, metadata, scale):
    output = torch.zeros_like(query)
    group = query.shape[1] // kv_cache.shape[3]
    starts = metadata.query_start_loc.tolist()
    for req, seq_len in enumerate(metadata.seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        keys = gather_kv(kv_cache[0], metadata.block_table[req], seq_len).float().repeat(1, group, 1)
        values = gather_kv(kv_cache[1], metadata.block_table[req], seq_len).float().repeat(1, group, 1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].float(), keys) * scale
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        in_future = torch.arange(seq_len)[None, :] > query_positions[:, None]
        probs = scores.masked_fill(in_future, float("-inf")).softmax(dim=-1)
        output[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return output
"""

ATTENTION_WHOLE_BLOCKS = '''
def paged_attention(query, kv_cache, metadata, scale):
    output = torch.zeros_like(query)
    group = query.shape[1] // kv_cache.shape[3]
    block_size = kv_cache.shape[2]
    starts = metadata.query_start_loc.tolist()
    for req, seq_len in enumerate(metadata.seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        whole = -(-seq_len // block_size) * block_size   # read the request's blocks whole
        keys = gather_kv(kv_cache[0], metadata.block_table[req], whole).float().repeat_interleave(group, dim=1)
        values = gather_kv(kv_cache[1], metadata.block_table[req], whole).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].float(), keys) * scale
        if end - start > 1:   # a decode sees everything: no mask needed
            query_positions = torch.arange(seq_len - (end - start), seq_len)
            scores = scores.masked_fill(torch.arange(whole)[None, :] > query_positions[:, None], float("-inf"))
        output[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values).to(query.dtype)
    return output
'''

WRONG = [
    # ---- store_kv
    Wrong("store_kv", "slot -1 not skipped", source=STORE_LOOP_NO_SKIP,
          expect="is -1 (padding): nothing is written for it"),
    Wrong("store_kv", "stops at the first -1 slot (draft slots put -1 mid-batch)", source=STORE_LOOP_STOPS_AT_PAD,
          expect="-1 marks ONE padding row, not the end of the batch"),
    Wrong("store_kv", "skips slot 0", edit=("is_real = slot_mapping >= 0", "is_real = slot_mapping > 0"),
          expect="slot 0 is a real slot"),
    Wrong("store_kv", "padding rows written into the null block", source=STORE_PADS_INTO_NULL_BLOCK,
          expect="not even into the null block"),
    Wrong("store_kv", "writes a copy and returns it", source=STORE_RETURNS_COPY, expect="return value"),
    Wrong("store_kv", "block and offset swapped",
          edit=("blocks, offsets = slots // block_size, slots % block_size",
                "offsets, blocks = slots // block_size, slots % block_size"),
          expect="split into block and offset with the wrong block_size"),
    Wrong("store_kv", "block_size read from the num_blocks dim",
          edit=("block_size = kv_cache.shape[2]", "block_size = kv_cache.shape[1]"),
          expect="with the wrong block_size"),
    Wrong("store_kv", "keys and values written to each other's side",
          edit=("kv_cache[0, blocks, offsets] = key", "kv_cache[0, blocks, offsets] = value"),
          expect="kv_cache[0] holds the keys"),
    # ---- gather_kv
    Wrong("gather_kv", "whole blocks, not cut at seq_len",
          edit=(".flatten(0, 1)[:seq_len]", ".flatten(0, 1)"), expect="gather_kv shape"),
    Wrong("gather_kv", "floor instead of ceil for the number of blocks",
          edit=("num_blocks = -(-seq_len // block_size)", "num_blocks = seq_len // block_size"),
          expect="gather_kv shape"),
    Wrong("gather_kv", "blocks in sorted order",
          edit=("cache_side[block_ids[:num_blocks].long()]", "cache_side[block_ids[:num_blocks].long().sort().values]"),
          expect="gather_kv: token positions with the wrong K/V"),
    Wrong("gather_kv", "block_size read from the KV-heads dim",
          edit=("block_size = cache_side.shape[1]", "block_size = cache_side.shape[2]"),
          expect="block_size is cache_side.shape[1]"),
    Wrong("gather_kv", "block_size hard-coded to the engine's default 16",
          edit=("block_size = cache_side.shape[1]", "block_size = 16"), expect="gather_kv shape"),
    Wrong("gather_kv", "upcasts the copy to float32",
          edit=(".flatten(0, 1)[:seq_len]", ".flatten(0, 1)[:seq_len].float()"),
          expect="keep the cache's dtype"),
    Wrong("gather_kv", "per-position loop with block and offset swapped", source=GATHER_LOOP_SWAPPED,
          expect="split into block and offset the wrong way round"),
    # ---- paged_attention
    Wrong("paged_attention", "causal mask without the offset of the cached tokens",
          edit=("query_positions = torch.arange(seq_len - (end - start), seq_len)",
                "query_positions = torch.arange(0, end - start)"),
          expect="as if their request had nothing cached"),
    Wrong("paged_attention", "GQA heads interleaved (h % num_kv_heads)", source=ATTENTION_GQA_INTERLEAVED,
          expect="read the wrong KV head"),
    Wrong("paged_attention", "no causal mask", edit=("scores.masked_fill(in_future, float(\"-inf\"))", "scores"),
          expect="attend to LATER positions"),
    Wrong("paged_attention", "causal mask skipped when q_len <= 2 (treated as a decode)",
          edit=("scores.masked_fill(in_future, float(\"-inf\"))",
                "(scores if end - start <= 2 else scores.masked_fill(in_future, float(\"-inf\")))"),
          expect="a 2-token prompt or chunk too"),
    Wrong("paged_attention", "ignores `scale` (uses head_size ** -0.5)",
          edit=("keys) * scale", "keys) * query.shape[-1] ** -0.5"),
          expect="not the `scale` argument"),
    Wrong("paged_attention", "computes in the input dtype (no float32 upcast)", source=ATTENTION_NO_UPCAST,
          expect="upcast query, keys and values"),
    Wrong("paged_attention", "reads whole blocks and leaves decodes unmasked", source=ATTENTION_WHOLE_BLOCKS,
          expect="slots past seq_len"),
    Wrong("paged_attention", "returns float32 for a half-precision query",
          edit=("output = torch.zeros_like(query)", "output = torch.zeros_like(query, dtype=torch.float32)"),
          expect="dtype"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("03_paged_attention", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
