"""Mirrors vllm/v1/attention/backends/triton_attn.py and the Triton kernels it calls.

vLLM v0.33.0 keeps the kernels in vllm/v1/attention/ops/triton_reshape_and_cache_flash.py
(`reshape_and_cache_kernel_flash`, writing new keys and values into the paged cache) and
vllm/v1/attention/ops/triton_unified_attention.py (`kernel_unified_attention`: ONE kernel for prefill and
decode, whose `IS_3D` flag splits long contexts into segments merged by `reduce_segments`). This file has
the same jobs in three kernels, written to be read:

* ``store_kv``: one program per new token copies its K and V into the cache slot ``slot_mapping[t]``
  (slot ``s`` is block ``s // block_size``, offset ``s % block_size``); slot ``-1`` is padding and skipped.
* paged decode: one program per (request, KV head). All query heads that share the KV head (GQA) are
  handled together, so each key/value block is read from memory once. It walks the request's blocks
  through the block table with an online softmax (running max ``m``, running sum ``l``). This is the kernel
  phase 07 asks for, and what runs when a course exercise replaces it.
* split decode (the engine's default decode path): the same walk cut into segments of the context, one
  program per (request, KV head, segment), each leaving its partial ``acc``, ``m`` and ``l``; a second kernel
  merges the segments (the online-softmax merge rule). As vLLM's ``IS_3D`` path and ``reduce_segments``: a
  few requests with long contexts would otherwise leave most of the GPU idle (measured on an H100: one
  request over 4096 tokens ran 8 programs on 132 SMs). Its dot products go to the tensor cores
  (``tl.dot``, the group's query heads padded to 16 rows), so it reads a tile of 64 positions per iteration
  where the single-pass kernel reads 16.
* paged prefill: one program per (request, KV head, tile of query tokens). The rows of the query tile
  are (token, query head of the group) pairs, as in vLLM's unified kernel, so ``tl.dot`` always gets at
  least 16 rows. New tokens attend causally to the cached context plus themselves, which is exactly
  what chunked prefill and prefix-cache hits need.

``paged_attention`` and ``store_kv`` take the same arguments as :mod:`mini.attention.reference`, so the
engine can pick either backend: `TritonAttentionBackend` ("triton") holds the `attention` role's Triton parts
(mini/roles.py): ``triton_store_kv`` (this file's ``store_kv``), ``paged_decode`` and the two kernels they
launch, which they take as keyword arguments (the backend passes its own, which may be replacements).
Without a CUDA GPU the kernels run under ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mini.attention.metadata import AttentionBackend, AttentionMetadata
from mini.attention.triton_utils import (
    import_triton,
    is_available,
    next_power_of_2,
    unavailable_reason,
    use_interpreter,
)

# Raises ImportError with an explanation on platforms without Triton; sets TRITON_INTERPRET=1 without CUDA.
triton, tl = import_triton()

__all__ = [
    "AttentionMetadata",
    "TritonAttentionBackend",
    "is_available",
    "paged_attention",
    "paged_decode",
    "paged_prefill",
    "store_kv",
    "unavailable_reason",
]

# Tile sizes, chosen so that head_size 128 compiles for sm_90 without register spills. Key/value tiles
# count positions (any block size works: each position is mapped through the block table).
DECODE_TILE_N = 16  # small: the decode product [group, tile, head_size] lives in registers
DECODE_NUM_WARPS = 8
# Split decode: positions per tile (tl.dot: the product lives in the tensor cores' accumulators, not spread
# over registers), at most this many segments per request, and the programs it aims to give the GPU.
SPLIT_DECODE_TILE_N = {torch.float16: 64, torch.bfloat16: 64, torch.float32: 32}
SPLIT_DECODE_NUM_WARPS = 8  # 4 spills registers at 64 positions x head size 128 on sm_90
MAX_DECODE_SEGMENTS = 16
# Prefill: target rows (token, head) per query tile, and key/value positions per tile; tl.dot needs >= 16.
# float32 uses exact (non tensor-core) dots, which need smaller tiles.
PREFILL_TILE_ROWS = {torch.float16: 64, torch.bfloat16: 64, torch.float32: 32}
PREFILL_TILE_N = {torch.float16: 32, torch.bfloat16: 32, torch.float32: 16}
PREFILL_NUM_WARPS = 8


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, kv_cache_ptr, slot_mapping_ptr,
    stride_key_token, stride_key_head, stride_value_token, stride_value_head,
    stride_cache_kv, stride_cache_block, stride_cache_slot, stride_cache_head,
    num_kv_heads, head_size, block_size,
    KV_HEADS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    heads = tl.arange(0, KV_HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_size)
    key = tl.load(key_ptr + token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :], mask=mask)
    value = tl.load(
        value_ptr + token * stride_value_token + heads[:, None] * stride_value_head + dims[None, :], mask=mask
    )
    cache_offsets = (
        (slot // block_size) * stride_cache_block
        + (slot % block_size) * stride_cache_slot
        + heads[:, None] * stride_cache_head
        + dims[None, :]
    )
    tl.store(kv_cache_ptr + cache_offsets, key.to(kv_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(kv_cache_ptr + stride_cache_kv + cache_offsets, value.to(kv_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _paged_decode_kernel(
    out_ptr, query_ptr, kv_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, scale,
    stride_query_token, stride_query_head, stride_out_token, stride_out_head,
    stride_cache_kv, stride_cache_block, stride_cache_slot, stride_cache_head, stride_block_table_row,
    head_size, block_size, num_queries_per_kv,
    GROUP_PAD: tl.constexpr, HEAD_PAD: tl.constexpr, TILE_N: tl.constexpr,
):
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    token = tl.load(query_start_loc_ptr + request)  # the request's single new token
    if tl.load(query_start_loc_ptr + request + 1) - token != 1:  # no new token this step: nothing to do
        return
    seq_len = tl.load(seq_lens_ptr + request)

    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    dim_mask = dims < head_size
    q_mask = (group[:, None] < num_queries_per_kv) & dim_mask[None, :]
    q_heads = kv_head * num_queries_per_kv + group
    q_offsets = token * stride_query_token + q_heads[:, None] * stride_query_head + dims[None, :]
    query = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0).to(tl.float32) * scale  # [G, D]

    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    key_base = kv_cache_ptr + kv_head * stride_cache_head
    value_base = key_base + stride_cache_kv
    for tile_start in range(0, seq_len, TILE_N):
        positions = tile_start + tl.arange(0, TILE_N)
        pos_mask = positions < seq_len
        block_ids = tl.load(
            block_table_ptr + request * stride_block_table_row + positions // block_size, mask=pos_mask, other=0
        ).to(tl.int64)
        slot_offsets = block_ids * stride_cache_block + (positions % block_size) * stride_cache_slot
        kv_offsets = slot_offsets[:, None] + dims[None, :]
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        key = tl.load(key_base + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        # One query row per head: tl.dot needs >= 16 rows, so multiply and reduce instead.
        scores = tl.sum(query[:, None, :] * key[None, :, :], axis=2)  # [G, N]
        scores = tl.where(pos_mask[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        correction = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, axis=1)
        value = tl.load(value_base + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        acc = acc * correction[:, None] + tl.sum(probs[:, :, None] * value[None, :, :], axis=1)
        running_max = new_max

    out = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    out_offsets = token * stride_out_token + q_heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)



@triton.jit
def _paged_decode_segment_kernel(
    part_out_ptr, part_max_ptr, part_sum_ptr, query_ptr, kv_cache_ptr, block_table_ptr, seq_lens_ptr,
    query_start_loc_ptr, scale,
    stride_query_token, stride_query_head,
    stride_cache_kv, stride_cache_block, stride_cache_slot, stride_cache_head, stride_block_table_row,
    head_size, block_size, num_queries_per_kv, num_heads, num_segments,
    ROWS: tl.constexpr, HEAD_PAD: tl.constexpr, TILE_N: tl.constexpr, USE_FP32_DOT: tl.constexpr,
):
    """One segment of one request's context for one KV head: the partial (unnormalised) output, max and sum
    of the group's query heads, at part[request, q_head, segment]."""
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    token = tl.load(query_start_loc_ptr + request)
    if tl.load(query_start_loc_ptr + request + 1) - token != 1:  # no new token this step: nothing to do
        return
    seq_len = tl.load(seq_lens_ptr + request)
    segment_len = tl.cdiv(tl.cdiv(seq_len, num_segments), TILE_N) * TILE_N  # whole tiles per segment
    start = segment * segment_len
    end = tl.minimum(start + segment_len, seq_len)  # start >= end: an empty segment (m = -inf, l = 0)

    rows = tl.arange(0, ROWS)  # query heads of the group, padded to the 16 rows tl.dot needs
    dims = tl.arange(0, HEAD_PAD)
    dim_mask = dims < head_size
    row_mask = rows < num_queries_per_kv
    q_heads = kv_head * num_queries_per_kv + rows
    q_mask = row_mask[:, None] & dim_mask[None, :]
    query = tl.load(query_ptr + token * stride_query_token + q_heads[:, None] * stride_query_head + dims[None, :],
                    mask=q_mask, other=0.0)  # [R, D]

    running_max = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_PAD], dtype=tl.float32)
    key_base = kv_cache_ptr + kv_head * stride_cache_head
    value_base = key_base + stride_cache_kv
    for tile_start in range(start, end, TILE_N):
        positions = tile_start + tl.arange(0, TILE_N)
        pos_mask = positions < end
        block_ids = tl.load(
            block_table_ptr + request * stride_block_table_row + positions // block_size, mask=pos_mask, other=0
        ).to(tl.int64)
        kv_offsets = (block_ids * stride_cache_block + (positions % block_size) * stride_cache_slot)[:, None] \
            + dims[None, :]
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        key = tl.load(key_base + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        if USE_FP32_DOT:  # fp32 inputs, and always under the interpreter (its bf16 dot is wrong)
            scores = tl.dot(query.to(tl.float32), tl.trans(key.to(tl.float32)), input_precision="ieee")
        else:  # fp16/bf16 on tensor cores, fp32 accumulation
            scores = tl.dot(query, tl.trans(key))
        scores = tl.where(pos_mask[None, :], scores * scale, float("-inf"))  # [R, N]
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        correction = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, axis=1)
        value = tl.load(value_base + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        if USE_FP32_DOT:
            weighted = tl.dot(probs, value.to(tl.float32), input_precision="ieee")
        else:
            weighted = tl.dot(probs.to(value.dtype), value)
        acc = acc * correction[:, None] + weighted
        running_max = new_max

    part = (request * num_heads + q_heads) * num_segments + segment  # [R]
    tl.store(part_max_ptr + part, running_max, mask=row_mask)
    tl.store(part_sum_ptr + part, running_sum, mask=row_mask)
    tl.store(part_out_ptr + part[:, None] * HEAD_PAD + dims[None, :], acc, mask=row_mask[:, None])


@triton.jit
def _reduce_segments_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, query_start_loc_ptr,
    stride_out_token, stride_out_head, head_size, num_heads, num_segments,
    SEGMENTS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Merge one (request, query head)'s segments: rescale each to the largest max, sum, normalise."""
    request = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(query_start_loc_ptr + request)
    if tl.load(query_start_loc_ptr + request + 1) - token != 1:
        return
    segments = tl.arange(0, SEGMENTS_PAD)
    seg_mask = segments < num_segments
    dims = tl.arange(0, HEAD_PAD)
    part = (request * num_heads + head) * num_segments + segments
    maxes = tl.load(part_max_ptr + part, mask=seg_mask, other=float("-inf"))
    overall = tl.max(maxes, axis=0)  # finite: the first segment always holds position 0
    weights = tl.exp(maxes - overall)  # an empty segment (max -inf) weighs 0
    total = tl.sum(tl.load(part_sum_ptr + part, mask=seg_mask, other=0.0) * weights, axis=0)
    parts = tl.load(part_out_ptr + part[:, None] * HEAD_PAD + dims[None, :], mask=seg_mask[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + token * stride_out_token + head * stride_out_head + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < head_size)

@triton.jit
def _paged_prefill_kernel(
    out_ptr, query_ptr, kv_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, scale,
    stride_query_token, stride_query_head, stride_out_token, stride_out_head,
    stride_cache_kv, stride_cache_block, stride_cache_slot, stride_cache_head, stride_block_table_row,
    head_size, block_size, num_queries_per_kv,
    GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_PAD: tl.constexpr, TILE_N: tl.constexpr,
    USE_FP32_DOT: tl.constexpr,
):
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    query_block = tl.program_id(2)
    query_start = tl.load(query_start_loc_ptr + request)
    query_len = tl.load(query_start_loc_ptr + request + 1) - query_start
    if query_block * BLOCK_Q >= query_len:  # this request has fewer new tokens than the grid allows
        return
    seq_len = tl.load(seq_lens_ptr + request)
    context_len = seq_len - query_len  # tokens already in the cache before this step

    # Row r of the tile is (token r // GROUP_PAD, query head r % GROUP_PAD of this KV head's group).
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    local_token = query_block * BLOCK_Q + rows // GROUP_PAD
    group = rows % GROUP_PAD
    row_mask = (local_token < query_len) & (group < num_queries_per_kv)
    dims = tl.arange(0, HEAD_PAD)
    dim_mask = dims < head_size
    q_heads = kv_head * num_queries_per_kv + group
    q_offsets = (query_start + local_token)[:, None] * stride_query_token + q_heads[:, None] * stride_query_head
    q_mask = row_mask[:, None] & dim_mask[None, :]
    query = tl.load(query_ptr + q_offsets + dims[None, :], mask=q_mask, other=0.0)  # [M, D]
    query_pos = context_len + local_token  # absolute position of each row's token

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    key_base = kv_cache_ptr + kv_head * stride_cache_head
    value_base = key_base + stride_cache_kv
    kv_end = tl.minimum(seq_len, context_len + (query_block + 1) * BLOCK_Q)  # later keys are all masked
    for tile_start in range(0, kv_end, TILE_N):
        positions = tile_start + tl.arange(0, TILE_N)
        pos_mask = positions < kv_end
        block_ids = tl.load(
            block_table_ptr + request * stride_block_table_row + positions // block_size, mask=pos_mask, other=0
        ).to(tl.int64)
        slot_offsets = block_ids * stride_cache_block + (positions % block_size) * stride_cache_slot
        kv_offsets = slot_offsets[:, None] + dims[None, :]
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        key = tl.load(key_base + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        if USE_FP32_DOT:  # fp32 inputs, and always under the interpreter (its bf16 dot is wrong)
            scores = tl.dot(query.to(tl.float32), tl.trans(key.to(tl.float32)), input_precision="ieee")
        else:  # fp16/bf16 on tensor cores, fp32 accumulation
            scores = tl.dot(query, tl.trans(key))
        scores = scores * scale
        causal = (positions[None, :] <= query_pos[:, None]) & pos_mask[None, :]
        scores = tl.where(causal, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows with nothing visible yet
        correction = tl.exp(running_max - safe_max)
        probs = tl.exp(scores - safe_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, axis=1)
        value = tl.load(value_base + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        if USE_FP32_DOT:
            weighted = tl.dot(probs, value.to(tl.float32), input_precision="ieee")
        else:
            weighted = tl.dot(probs.to(value.dtype), value)
        acc = acc * correction[:, None] + weighted
        running_max = new_max

    out = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    out_offsets = (query_start + local_token)[:, None] * stride_out_token + q_heads[:, None] * stride_out_head
    tl.store(out_ptr + out_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)


def _check_kv_cache(kv_cache: torch.Tensor) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            "kv_cache must have shape [2, num_blocks, block_size, num_kv_heads, head_size], "
            f"got {tuple(kv_cache.shape)}"
        )
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last (head_size) dimension")
    if not use_interpreter() and not kv_cache.is_cuda:
        raise ValueError("the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             *, _store_kv_kernel: Any = _store_kv_kernel) -> None:
    """Write key/value [T, num_kv_heads, head_size] into kv_cache at slot_mapping[t]; slot -1 is skipped."""
    _check_kv_cache(kv_cache)
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_tokens = slot_mapping.shape[0]
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 3 or tuple(tensor.shape[1:]) != (num_kv_heads, head_size) or len(tensor) < num_tokens:
            raise ValueError(
                f"{name} must have shape [num_tokens >= {num_tokens}, {num_kv_heads}, {head_size}] "
                f"(num_kv_heads, head_size of kv_cache), got {tuple(tensor.shape)}"
            )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    _store_kv_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping.contiguous(),
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        num_kv_heads, head_size, block_size,
        KV_HEADS_PAD=next_power_of_2(num_kv_heads), HEAD_PAD=next_power_of_2(head_size),
    )


@dataclass(slots=True)
class _AttentionLaunch:
    """The arguments shared by the decode and prefill kernels, validated once."""

    output: torch.Tensor
    tensors: tuple  # output, query, kv_cache, block_table, seq_lens, query_start_loc
    strides: tuple  # query, output, kv_cache, block_table strides, then head_size, block_size, group size
    num_requests: int
    num_kv_heads: int
    group_size: int  # query heads per KV head (GQA)
    head_size: int


def _prepare_launch(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> _AttentionLaunch:
    """Validate shapes and allocate the output (rows of padding tokens stay zero, as in the reference)."""
    _check_kv_cache(kv_cache)
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    if query.dim() != 3 or query.shape[2] != head_size or query.shape[1] % num_kv_heads != 0:
        raise ValueError(
            f"query must have shape [num_tokens, num_heads, {head_size}] with num_heads a multiple of "
            f"num_kv_heads={num_kv_heads}, got {tuple(query.shape)}"
        )
    if query.dtype != kv_cache.dtype:
        raise TypeError(f"query dtype {query.dtype} must match kv_cache dtype {kv_cache.dtype}")
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_table = metadata.block_table.contiguous()
    output = torch.zeros_like(query)
    group_size = query.shape[1] // num_kv_heads
    tensors = (
        output, query, kv_cache, block_table, metadata.seq_lens.contiguous(), metadata.query_start_loc.contiguous()
    )
    strides = (
        query.stride(0), query.stride(1), output.stride(0), output.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_table.stride(0),
        head_size, block_size, group_size,
    )
    return _AttentionLaunch(
        output, tensors, strides, metadata.seq_lens.shape[0], num_kv_heads, group_size, head_size
    )


def num_decode_segments(num_requests: int, num_kv_heads: int, device: torch.device) -> int:
    """Segments per request for the split decode: enough (request, KV head, segment) programs to give every
    streaming multiprocessor two, at most MAX_DECODE_SEGMENTS. A function of the batch's shape only (never of
    its lengths), so a CUDA graph captured for a batch size stays valid."""
    if device.type == "cuda":
        target = 2 * _multiprocessor_count(device.index if device.index is not None else torch.cuda.current_device())
    else:  # the interpreter: small, but more than one, so the merge is exercised
        target = 8
    return max(1, min(MAX_DECODE_SEGMENTS, -(-target // max(1, num_requests * num_kv_heads))))


_SM_COUNTS: dict[int, int] = {}


def _multiprocessor_count(index: int) -> int:
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


def paged_decode(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
    *, _paged_decode_kernel: Any = _paged_decode_kernel, num_segments: int | None = None,
) -> torch.Tensor:
    """Attention for a batch where every request has exactly one new token (query [B, Hq, D]).

    With this file's own `_paged_decode_kernel` (the engine's default) it runs the split decode: segments of
    the context in parallel, then their merge (`num_segments`: None picks `num_decode_segments`; 0 runs the
    single-pass kernel instead). With another kernel (a course exercise's), that kernel in one pass, one
    program per (request, KV head)."""
    replaced = _paged_decode_kernel is not _PAGED_DECODE_KERNEL
    if replaced and num_segments:
        raise ValueError(f"num_segments={num_segments} needs the split decode, which a replaced "
                         "_paged_decode_kernel turns off (pass None or 0)")
    launch = _prepare_launch(query, kv_cache, metadata)
    if launch.num_requests == 0:
        return launch.output
    if replaced or num_segments == 0:
        _paged_decode_kernel[(launch.num_requests, launch.num_kv_heads)](
            *launch.tensors, scale, *launch.strides,
            GROUP_PAD=next_power_of_2(launch.group_size), HEAD_PAD=next_power_of_2(launch.head_size),
            TILE_N=DECODE_TILE_N, num_warps=DECODE_NUM_WARPS,
        )
        return launch.output
    if query.dtype not in SPLIT_DECODE_TILE_N:
        raise TypeError(f"query dtype must be one of {tuple(SPLIT_DECODE_TILE_N)}, got {query.dtype}")
    segments = num_segments or num_decode_segments(launch.num_requests, launch.num_kv_heads, query.device)
    num_heads = query.shape[1]
    head_pad = max(16, next_power_of_2(launch.head_size))
    part_out = torch.empty(launch.num_requests, num_heads, segments, head_pad, dtype=torch.float32,
                           device=query.device)
    part_max = torch.empty(launch.num_requests, num_heads, segments, dtype=torch.float32, device=query.device)
    part_sum = torch.empty_like(part_max)
    output, query, kv_cache, block_table, seq_lens, query_start_loc = launch.tensors
    (stride_query_token, stride_query_head, stride_out_token, stride_out_head, *cache_strides,
     head_size, block_size, group_size) = launch.strides
    _paged_decode_segment_kernel[(launch.num_requests, launch.num_kv_heads, segments)](
        part_out, part_max, part_sum, query, kv_cache, block_table, seq_lens, query_start_loc, scale,
        stride_query_token, stride_query_head, *cache_strides,
        head_size, block_size, group_size, num_heads, segments,
        ROWS=max(16, next_power_of_2(group_size)), HEAD_PAD=head_pad, TILE_N=SPLIT_DECODE_TILE_N[query.dtype],
        USE_FP32_DOT=use_interpreter() or query.dtype == torch.float32, num_warps=SPLIT_DECODE_NUM_WARPS,
    )
    _reduce_segments_kernel[(launch.num_requests, num_heads)](
        output, part_out, part_max, part_sum, query_start_loc, stride_out_token, stride_out_head,
        head_size, num_heads, segments, SEGMENTS_PAD=next_power_of_2(segments), HEAD_PAD=head_pad,
    )
    return output


_PAGED_DECODE_KERNEL = _paged_decode_kernel  # the default above: "not replaced" is an identity test


def paged_prefill(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Varlen causal attention of each request's new tokens over its cached context plus themselves."""
    launch = _prepare_launch(query, kv_cache, metadata)
    if launch.num_requests == 0 or metadata.max_query_len < 1:
        return launch.output
    if query.dtype not in PREFILL_TILE_N:
        raise TypeError(f"query dtype must be one of {tuple(PREFILL_TILE_N)}, got {query.dtype}")
    group_pad = next_power_of_2(launch.group_size)
    # Tile rows are (token, head) pairs: BLOCK_Q tokens x group_pad heads, at least 16 rows for tl.dot.
    target_rows = PREFILL_TILE_ROWS[query.dtype]
    block_q = max(1, min(next_power_of_2(metadata.max_query_len), target_rows // group_pad), 16 // group_pad)
    grid = (launch.num_requests, launch.num_kv_heads, triton.cdiv(metadata.max_query_len, block_q))
    _paged_prefill_kernel[grid](
        *launch.tensors, scale, *launch.strides,
        GROUP_PAD=group_pad, BLOCK_Q=block_q, HEAD_PAD=max(16, next_power_of_2(launch.head_size)),
        TILE_N=PREFILL_TILE_N[query.dtype], USE_FP32_DOT=use_interpreter() or query.dtype == torch.float32,
        num_warps=PREFILL_NUM_WARPS,
    )
    return launch.output


def paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """query [T, Hq, D] -> [T, Hq, D]. All q_len == 1: the decode kernel; otherwise the prefill kernel."""
    if metadata.max_query_len == 1:
        return paged_decode(query, kv_cache, metadata, scale)
    return paged_prefill(query, kv_cache, metadata, scale)


class TritonAttentionBackend(AttentionBackend):
    """The Triton backend ("triton", the default on CUDA). Home of the `attention` role's Triton parts.

    vLLM: `TritonAttentionBackend` / `TritonAttentionImpl` (vllm/v1/attention/backends/triton_attn.py).
    """

    name: ClassVar[str] = "triton"
    triton_store_kv = staticmethod(store_kv)
    paged_decode = staticmethod(paged_decode)
    _store_kv_kernel = staticmethod(_store_kv_kernel)
    _paged_decode_kernel = staticmethod(_paged_decode_kernel)

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        self.triton_store_kv(key, value, kv_cache, slot_mapping)

    def paged_attention(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                        scale: float) -> torch.Tensor:
        """All q_len == 1: `paged_decode`; otherwise the prefill kernel."""
        if metadata.max_query_len == 1:
            return self.paged_decode(query, kv_cache, metadata, scale)
        return paged_prefill(query, kv_cache, metadata, scale)
