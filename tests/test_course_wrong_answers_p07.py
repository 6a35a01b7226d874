"""Phase 07's checks reject plausible wrong answers (each fails with a message that locates the bug).

The Triton ones run under TRITON_INTERPRET=1 on CPU (skipped without Triton); the cases are tiny.
"""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

from mini.attention import triton_utils

WRONG = [
    Wrong("online_softmax_update", "no guard for an all -inf row (nan)",
          edit=("safe_max = torch.where(torch.isinf(new_max) & (new_max < 0), torch.zeros_like(new_max), new_max)",
                "safe_max = new_max"),
          expect="all -inf so far"),
    Wrong("online_softmax_update", "acc not rescaled",
          edit=("new_acc = acc * correction[:, None] + probs @ values", "new_acc = acc + probs @ values"),
          expect="new_acc after tile 1"),
    Wrong("online_softmax_update", "correction inverted",
          edit=("correction = torch.exp(running_max - safe_max)", "correction = torch.exp(safe_max - running_max)"),
          expect="must be 0 on the first tile"),
    Wrong("online_softmax_update", "max of this tile only, the running max forgotten",
          edit=("new_max = torch.maximum(running_max, scores.max(dim=1).values)", "new_max = scores.max(dim=1).values"),
          expect="largest score seen so far"),
    # the Triton exercises (skipped without Triton)
    Wrong("_store_kv_kernel", "no padding guard", edit=("if slot >= 0:  # slot -1 is a padding token", "if True:"),
          expect="wrote OUTSIDE kv_cache"),
    Wrong("_store_kv_kernel", "values written over the keys",
          edit=("tl.store(kv_cache_ptr + stride_cache_kv + target", "tl.store(kv_cache_ptr + target"),
          expect="first wrong slot"),
    Wrong("_store_kv_kernel", "block and offset swapped",
          edit=("target = ((slot // block_size) * stride_cache_block + (slot % block_size) * stride_cache_slot",
                "target = ((slot % block_size) * stride_cache_block + (slot // block_size) * stride_cache_slot"),
          expect="no token maps to it"),
    Wrong("store_kv", "block_size read from the num_blocks dimension",
          edit=("_, _, block_size, num_kv_heads, head_size = kv_cache.shape",
                "_, block_size, _, num_kv_heads, head_size = kv_cache.shape"),
          expect="first wrong slot"),
    Wrong("store_kv", "block and slot strides swapped",
          edit=("kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),\n        num_kv_heads",
                "kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(1), kv_cache.stride(3),\n        num_kv_heads"),
          expect="no token maps to it"),
    Wrong("_paged_decode_kernel", "positions past seq_len not masked in the scores",
          edit=("scores = tl.where(pos_mask[None, :], scores, float(\"-inf\"))", "scores = scores"),
          expect="ends inside a tile"),
    Wrong("_paged_decode_kernel", "acc not rescaled by the correction",
          edit=("acc = acc * correction[:, None] + tl.sum", "acc = acc + tl.sum"),
          expect="requests within one tile"),
    Wrong("_paged_decode_kernel", "position used as the block index",
          edit=("block_table_ptr + request * stride_block_table_row + pos // block_size",
                "block_table_ptr + request * stride_block_table_row + pos % block_size"),
          expect="it did NOT read"),
    Wrong("_paged_decode_kernel", "every program walks request 0's block-table row",
          edit=("block_table_ptr + request * stride_block_table_row + pos // block_size",
                "block_table_ptr + pos // block_size"),
          expect="it did NOT read"),
    Wrong("paged_decode", "scale not passed (1.0)",
          edit=("metadata.query_start_loc.contiguous(), scale,", "metadata.query_start_loc.contiguous(), 1.0,"),
          expect="without the softmax scale"),
    Wrong("paged_decode", "GROUP_PAD sized for the KV heads",
          edit=("GROUP_PAD=next_power_of_2(group_size)", "GROUP_PAD=next_power_of_2(num_kv_heads)"),
          expect="never written"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("07_attention_kernel", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    if wrong.exercise != "online_softmax_update" and not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    assert_wrong_fails(assignment_id, wrong)
