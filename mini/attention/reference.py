"""Paged attention in plain PyTorch: write K/V by slot, then attend through the block table.

Mirrors vllm/v1/attention/backends/flash_attn.py (FlashAttentionMetadata, FlashAttentionImpl.forward and
`do_kv_cache_update`, which calls the CUDA cache write `reshape_and_cache_flash` of vllm/_custom_ops.py),
written as readable tensor code instead of kernels. The Triton backend (mini/attention/triton_paged.py) has
the same signatures.

KV cache layout (contract): one tensor per layer, `[2, num_blocks, block_size, num_kv_heads, head_size]`;
index 0 holds keys, 1 values; slot `s` lives in block `s // block_size` at offset `s % block_size`.
vLLM v0.33.0 views one layer's cache as `[num_blocks, num_kv_heads, block_size, 2 * head_size]` (keys and
values side by side in the last dimension, the memory order chosen by a `KVCacheLayout`, by default block,
slot, head) and FlashAttentionImpl splits it into a key and a value view, each
`[num_blocks, block_size, num_kv_heads, head_size]`: the same per-side shape as mini's `kv_cache[0]` and
`kv_cache[1]`.

The batch is flat: request i owns query rows `query_start_loc[i]:query_start_loc[i+1]`. Those new tokens
sit at positions `seq_lens[i] - q_len .. seq_lens[i] - 1` of the request, and each attends to every
cached position up to and including its own (causal). Prefill, chunked prefill and decode are the same
rule with different `q_len`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mini.attention.metadata import AttentionBackend, AttentionMetadata
from mini.utils import cdiv

__all__ = ["AttentionMetadata", "ReferenceAttentionBackend", "gather_kv", "paged_attention", "store_kv"]


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write each token's key/value into its slot: key/value `[T, Hkv, D]`; slots of -1 are skipped."""
    block_size = kv_cache.shape[2]
    num_slots = slot_mapping.shape[0]
    is_real = slot_mapping >= 0
    slots = slot_mapping[is_real]
    block_ids = slots // block_size
    offsets = slots % block_size
    kv_cache[0, block_ids, offsets] = key[:num_slots][is_real].to(kv_cache.dtype)
    kv_cache[1, block_ids, offsets] = value[:num_slots][is_real].to(kv_cache.dtype)


def gather_kv(cache_side: torch.Tensor, block_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first `seq_len` tokens of one request, contiguous: `[seq_len, Hkv, D]`.

    `cache_side` is `kv_cache[0]` (keys) or `kv_cache[1]` (values): `[num_blocks, block_size, Hkv, D]`.
    """
    block_size = cache_side.shape[1]
    num_blocks = cdiv(seq_len, block_size)
    blocks = cache_side[block_ids[:num_blocks].long()]  # [num_blocks, block_size, Hkv, D]
    return blocks.flatten(0, 1)[:seq_len]


def paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
    *, gather_kv=gather_kv,
) -> torch.Tensor:
    """Causal attention of the flat query `[T, Hq, D]` over each request's paged K/V -> `[T, Hq, D]`.

    Requests with a single new token (decode) are done together in one batched computation; requests
    with several new tokens (prefill or a prefill chunk) loop one by one, reading their context with
    `gather_kv` (a keyword: the backend passes its own, which may be a replacement). Math is float32 inside.
    """
    output = torch.zeros_like(query)
    query_lens = metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]
    is_decode = query_lens == 1
    if metadata.max_query_len == 1:  # decode-only batch: row i is request i
        num_reqs = query_lens.shape[0]
        output[:num_reqs] = _decode_attention(
            query[:num_reqs], kv_cache, metadata.block_table, metadata.seq_lens, scale
        ).to(query.dtype)
        return output
    if bool(is_decode.any()):
        decode_reqs = is_decode.nonzero().squeeze(1)
        rows = metadata.query_start_loc[decode_reqs].long()
        output[rows] = _decode_attention(
            query[rows], kv_cache, metadata.block_table[decode_reqs], metadata.seq_lens[decode_reqs], scale
        ).to(query.dtype)
    starts = metadata.query_start_loc.tolist()
    seq_lens = metadata.seq_lens.tolist()
    for req, query_len in enumerate(query_lens.tolist()):
        if query_len <= 1:
            continue
        start, end = starts[req], starts[req + 1]
        keys = gather_kv(kv_cache[0], metadata.block_table[req], seq_lens[req])
        values = gather_kv(kv_cache[1], metadata.block_table[req], seq_lens[req])
        output[start:end] = _attend_one_request(query[start:end], keys, values, scale).to(query.dtype)
    return output


def _attend_one_request(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """One request: query `[q_len, Hq, D]` (the LAST q_len positions), keys/values `[seq_len, Hkv, D]`."""
    query_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group_size = num_heads // num_kv_heads
    # GQA: query head h reads kv head h // group_size, so repeat each kv head group_size times.
    keys = keys.float().repeat_interleave(group_size, dim=1)
    values = values.float().repeat_interleave(group_size, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale  # [Hq, q_len, seq_len]
    query_positions = torch.arange(seq_len - query_len, seq_len, device=query.device)
    key_positions = torch.arange(seq_len, device=query.device)
    in_future = key_positions[None, :] > query_positions[:, None]  # [q_len, seq_len]
    scores = scores.masked_fill(in_future, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def _decode_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Batched decode: query `[B, Hq, D]`, one new token per request, which sees its whole context.

    Same math as `_attend_one_request` (no causal part: the single query is the last position), done
    for all requests at once by torch's fused scaled_dot_product_attention, with a padding mask.
    """
    batch_size, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[3]
    group_size = num_heads // num_kv_heads
    max_seq_len = int(seq_lens.max())
    block_size = kv_cache.shape[2]
    max_blocks = cdiv(max_seq_len, block_size)
    blocks = block_table[:, :max_blocks].long()
    # [B, max_blocks, block_size, Hkv, D] -> [B, Hkv, L, D]; positions past seq_len are masked below.
    keys = kv_cache[0][blocks].flatten(1, 2)[:, :max_seq_len].transpose(1, 2).float()
    values = kv_cache[1][blocks].flatten(1, 2)[:, :max_seq_len].transpose(1, 2).float()
    # GQA without copies: the `group_size` query heads sharing kv head k are viewed as `group_size`
    # query rows of kv head k (head h reads kv head h // group_size, as repeat_interleave would give).
    grouped_query = query.float().view(batch_size, num_kv_heads, group_size, head_size)
    is_real_key = torch.arange(max_seq_len, device=query.device)[None, :] < seq_lens[:, None]  # [B, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped_query, keys, values, attn_mask=is_real_key[:, None, None, :], scale=scale
    )
    return out.reshape(batch_size, num_heads, head_size)


class ReferenceAttentionBackend(AttentionBackend):
    """The readable backend ("torch"): home of the `attention` role's parts `store_kv`, `gather_kv` and
    `paged_attention` (mini/roles.py). Built once per engine; every layer of the model holds the instance.

    vLLM: an `AttentionBackend` class (vllm/v1/attention/backend.py) chosen once by
    vllm/v1/attention/selector.py, whose implementation each attention layer calls.
    """

    name: ClassVar[str] = "torch"
    store_kv = staticmethod(store_kv)
    gather_kv = staticmethod(gather_kv)
    paged_attention = staticmethod(paged_attention)
