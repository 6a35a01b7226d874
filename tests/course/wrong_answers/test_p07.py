"""Phase 07's checks reject plausible wrong answers (each fails with a message that locates the bug).

The Triton ones run under TRITON_INTERPRET=1 on CPU (skipped without Triton); the cases are tiny.
`CRASHING` lists wrong answers that crash the process under the interpreter (a wild write): each graded check
runs in a child process of its own (labs/checks/grading.py), where the crash becomes a failure of that exercise
that says "crashed", and the grading process goes on.
"""

import pytest

from mini.attention import triton_utils
from tests.course.fidelity import Wrong, assert_wrong_fails, build_wrong, check_of, solutions, wrong_params

STORE_MASK = "mask = (heads < num_kv_heads) & (dims < head_size)"
STORE_TARGET = ("target = ((slot // block_size) * stride_cache_block + (slot % block_size) * stride_cache_slot")
STORE_VALUE_LOAD = "value = tl.load(value_ptr + token * stride_value_token + heads * stride_value_head + dims, mask=mask)"
LAUNCH_STRIDES = "key.stride(0), key.stride(1), value.stride(0), value.stride(1),"
DECODE_GUARD = "if tl.load(query_start_loc_ptr + request + 1) - token == 1:"
DECODE_QUERY = ("q = tl.load(query_ptr + token * stride_query_token + heads[:, None] * stride_query_head + dims[None, :],\n"
                "                    mask=head_mask, other=0.0).to(tl.float32) * scale")

WRONG = [
    # exercise 1: online_softmax_update (PyTorch)
    Wrong("online_softmax_update", "no guard for an all -inf row (nan)",
          edit=("safe_max = torch.where(torch.isinf(new_max) & (new_max < 0), torch.zeros_like(new_max), new_max)",
                "safe_max = new_max"),
          expect="all -inf so far"),
    Wrong("online_softmax_update", "acc not rescaled",
          edit=("new_acc = acc * correction[:, None] + probs @ values", "new_acc = acc + probs @ values"),
          expect="new_acc after tile 1"),
    Wrong("online_softmax_update", "sum not rescaled",
          edit=("new_sum = running_sum * correction + probs.sum(dim=1)", "new_sum = running_sum + probs.sum(dim=1)"),
          expect="new_sum after tile 1"),
    Wrong("online_softmax_update", "correction inverted",
          edit=("correction = torch.exp(running_max - safe_max)", "correction = torch.exp(safe_max - running_max)"),
          expect="0 on the first tile"),
    Wrong("online_softmax_update", "max of this tile only, the running max forgotten",
          edit=("new_max = torch.maximum(running_max, scores.max(dim=1).values)", "new_max = scores.max(dim=1).values"),
          expect="largest score that row has seen so far"),
    Wrong("online_softmax_update", "max over the whole tile, every row together",
          edit=("new_max = torch.maximum(running_max, scores.max(dim=1).values)",
                "new_max = torch.maximum(running_max, scores.max())"),
          expect="every row got the same max"),
    Wrong("online_softmax_update", "tile max kept as a column (keepdim)",
          edit=("scores.max(dim=1).values", "scores.max(dim=1, keepdim=True).values"),
          expect="new_max has shape"),
    Wrong("online_softmax_update", "this tile's exps taken against the old max",
          edit=("probs = torch.exp(scores - safe_max[:, None])", "probs = torch.exp(scores - running_max[:, None])"),
          expect="an exp of a large positive number"),
    Wrong("online_softmax_update", "acc normalized at every tile",
          edit=("return new_max, new_sum, new_acc", "return new_max, new_sum, new_acc / new_sum[:, None]"),
          expect="new_acc after tile 0"),
    # exercise 2: _store_kv_kernel (Triton; skipped without Triton)
    Wrong("_store_kv_kernel", "no padding guard", edit=("if slot >= 0:  # slot -1 is a padding token", "if True:"),
          expect="wrote OUTSIDE kv_cache"),
    Wrong("_store_kv_kernel", "values written over the keys",
          edit=("tl.store(kv_cache_ptr + stride_cache_kv + target", "tl.store(kv_cache_ptr + target"),
          expect="kv_cache[0] (keys) holds the token's value"),
    Wrong("_store_kv_kernel", "block and offset swapped",
          edit=(STORE_TARGET,
                "target = ((slot % block_size) * stride_cache_block + (slot // block_size) * stride_cache_slot"),
          expect="no token maps to it"),
    Wrong("_store_kv_kernel", "no KV-head lane mask (3 KV heads in a tile of 4)",
          edit=(STORE_MASK, "mask = (dims < head_size) & (heads >= 0)"),
          expect="ran past its [num_kv_heads, head_size] tile"),
    Wrong("_store_kv_kernel", "no head_size lane mask (24 in a tile of 32)",
          edit=(STORE_MASK, "mask = (heads < num_kv_heads) & (dims >= 0)"),
          expect="ran past its [num_kv_heads, head_size] tile"),
    Wrong("_store_kv_kernel", "value addressed with key's strides",
          edit=(STORE_VALUE_LOAD,
                "value = tl.load(value_ptr + token * stride_key_token + heads * stride_key_head + dims, mask=mask)"),
          expect="address each through its own strides"),
    Wrong("_store_kv_kernel", "in-block offset as slot & (block_size - 1)",
          edit=("(slot % block_size) * stride_cache_slot", "(slot & (block_size - 1)) * stride_cache_slot"),
          expect="not a power of two"),
    # exercise 3: store_kv (the launcher)
    Wrong("store_kv", "block_size read from the num_blocks dimension",
          edit=("_, _, block_size, num_kv_heads, head_size = kv_cache.shape",
                "_, block_size, _, num_kv_heads, head_size = kv_cache.shape"),
          expect="first wrong slot"),
    Wrong("store_kv", "block and slot strides swapped",
          edit=("kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),\n        num_kv_heads",
                "kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(1), kv_cache.stride(3),\n        num_kv_heads"),
          expect="no token maps to it"),
    Wrong("store_kv", "grid from key's rows, not slot_mapping's",
          edit=("num_tokens = slot_mapping.shape[0]", "num_tokens = key.shape[0]"),
          expect="past the end of slot_mapping"),
    Wrong("store_kv", "inputs never made contiguous",
          edit=(("key = key if key.stride(-1) == 1 else key.contiguous()\n"
                 "    value = value if value.stride(-1) == 1 else value.contiguous()"),
                "key, value = key, value  # as they come"),
          expect="read as if its last dimension were contiguous"),
    Wrong("store_kv", "KV_HEADS_PAD not a power of two",
          edit=("KV_HEADS_PAD=next_power_of_2(num_kv_heads)", "KV_HEADS_PAD=num_kv_heads"),
          expect="power-of-two length"),
    Wrong("store_kv", "HEAD_PAD not a power of two",
          edit=("HEAD_PAD=next_power_of_2(head_size)", "HEAD_PAD=head_size"),
          expect="power-of-two length"),
    Wrong("store_kv", "the cache's strides of one side (kv_cache[0]) passed, the K/V stride dropped",
          edit=("kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),\n        num_kv_heads",
                "kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.stride(4),\n        num_kv_heads"),
          expect="no token maps to it"),
    Wrong("store_kv", "value's strides taken from key",
          edit=(LAUNCH_STRIDES, "key.stride(0), key.stride(1), key.stride(0), key.stride(1),"),
          expect="address each through its own strides"),
    # exercise 4: _paged_decode_kernel
    Wrong("_paged_decode_kernel", "positions past seq_len not masked in the scores",
          edit=("scores = tl.where(pos_mask[None, :], scores, float(\"-inf\"))", "scores = scores"),
          expect="ends inside a tile"),
    Wrong("_paged_decode_kernel", "acc not rescaled by the correction",
          edit=("acc = acc * correction[:, None] + tl.sum", "acc = acc + tl.sum"),
          expect="requests within one tile"),
    Wrong("_paged_decode_kernel", "running sum not rescaled by the correction",
          edit=("l = l * correction + tl.sum(p, axis=1)", "l = l + tl.sum(p, axis=1)"),
          expect="requests within one tile"),
    Wrong("_paged_decode_kernel", "position used as the block index",
          edit=("block_table_ptr + request * stride_block_table_row + pos // block_size",
                "block_table_ptr + request * stride_block_table_row + pos % block_size"),
          expect="it did NOT read"),
    Wrong("_paged_decode_kernel", "every program walks request 0's block-table row",
          edit=("block_table_ptr + request * stride_block_table_row + pos // block_size",
                "block_table_ptr + pos // block_size"),
          expect="it did NOT read"),
    Wrong("_paged_decode_kernel", "in-block offset as pos & (block_size - 1)",
          edit=("(pos % block_size) * stride_cache_slot", "(pos & (block_size - 1)) * stride_cache_slot"),
          expect="not a power of two"),
    Wrong("_paged_decode_kernel", "values read from the keys' side",
          edit=("v = tl.load(cache + stride_cache_kv + offsets", "v = tl.load(cache + offsets"),
          expect="it did NOT read: value"),
    Wrong("_paged_decode_kernel", "no query-length check: prefill rows written",
          edit=(DECODE_GUARD, "if True:"),
          expect="a prefill chunk, not a decode"),
    Wrong("_paged_decode_kernel", "scale recomputed as head_size ** -0.5",
          edit=(DECODE_QUERY, DECODE_QUERY.replace("* scale", "/ tl.sqrt(head_size * 1.0)")),
          expect="with head_size ** -0.5"),
    Wrong("_paged_decode_kernel", "query heads of the group offset by kv_head, not kv_head * group",
          edit=("heads = kv_head * num_queries_per_kv + group", "heads = kv_head + group"),
          expect="the same query heads are wrong"),
    Wrong("_paged_decode_kernel", "query head q paired with KV head q % num_kv_heads",
          edit=("heads = kv_head * num_queries_per_kv + group", "heads = kv_head + group * tl.num_programs(1)"),
          expect="q % num_kv_heads"),
    Wrong("_paged_decode_kernel", "math in the inputs' dtype (no float32 upcast)",
          source=solutions("07_attention_kernel").cell_defining("_paged_decode_kernel").source.replace(
              ".to(tl.float32)", ""),
          expect="the same case in float32 is right"),
    # exercise 5: paged_decode (the launcher)
    Wrong("paged_decode", "scale not passed (1.0)",
          edit=("metadata.query_start_loc.contiguous(), scale,", "metadata.query_start_loc.contiguous(), 1.0,"),
          expect="without the softmax scale"),
    Wrong("paged_decode", "GROUP_PAD sized for the KV heads",
          edit=("GROUP_PAD=next_power_of_2(group_size)", "GROUP_PAD=next_power_of_2(num_kv_heads)"),
          expect="never written"),
    Wrong("paged_decode", "output not cleared (torch.empty_like)",
          edit=("output = torch.zeros_like(query)", "output = torch.empty_like(query)"),
          expect="is a padding row"),
    Wrong("paged_decode", "block-table row stride taken from the wrong dimension",
          edit=("block_table.stride(0),\n", "block_table.stride(1),\n"),
          expect="it did NOT read"),
    Wrong("paged_decode", "grid axes swapped (KV heads, requests)",
          edit=("_paged_decode_kernel[(num_requests, num_kv_heads)]",
                "_paged_decode_kernel[(num_kv_heads, num_requests)]"),
          expect="axis 0 counts requests"),
    Wrong("paged_decode", "output allocated in float32",
          edit=("output = torch.zeros_like(query)", "output = torch.zeros(query.shape)"),
          expect="must return a new tensor like query"),
    Wrong("paged_decode", "query never made contiguous",
          edit=("query = query.contiguous()", "query = query  # as it comes"),
          expect="last dimension"),
]

CRASHING = [
    # the group's query heads spaced GROUP_PAD apart: with 3 query heads per KV head (padded to 4) the last
    # programs write past the end of the output, which the interpreter does not catch (heap corruption)
    Wrong("_paged_decode_kernel", "query heads of the group strided by GROUP_PAD, not num_queries_per_kv",
          edit=("heads = kv_head * num_queries_per_kv + group", "heads = kv_head * GROUP_PAD + group"),
          expect="crashed"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("07_attention_kernel", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    if wrong.exercise != "online_softmax_update" and not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    assert_wrong_fails(assignment_id, wrong)


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("07_attention_kernel", CRASHING))
def test_a_crashing_wrong_answer_fails_its_exercise_alone(assignment_id, wrong, monkeypatch):
    """A wild write corrupts the interpreter's heap: the child then dies of a signal or, as often, deadlocks in
    the allocator. Either way the exercise fails alone ("crashed" or "stopped making progress") and this process
    is still here to see it. The idle limit is short here only to keep the suite quick."""
    if not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    monkeypatch.setenv("MINI_LABS_IDLE_LIMIT_S", "10")
    check = check_of(assignment_id, wrong.exercise)
    with pytest.raises(AssertionError) as failure:
        check(build_wrong(assignment_id, wrong))
    message = str(failure.value)
    assert "crashed (" in message or "stopped making progress" in message, message
