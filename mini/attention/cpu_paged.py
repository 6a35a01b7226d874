"""Paged attention on the CPU, fast: plan once per step, gather whole blocks, one fused SDPA per group.

Mirrors vllm/v1/attention/backends/cpu_attn.py (CPUAttentionMetadataBuilder builds the per-step plan once,
CPUAttentionBackendImpl runs it in every layer; decode-like rows and prefill rows take different paths,
as vllm/v1/attention/backends/utils.py `split_decodes_and_prefills` splits them). Same signatures and
results as the readable reference (mini/attention/reference.py); what changes is how the work is cut:

* The plan (which rows go together, which blocks to read, the masks) depends only on the metadata, which
  is the same object for every layer of a step, so it is built once and reused by all layers.
* Short rows (decode, and speculative verification rows of 1 + k tokens) are sorted by query length,
  then context length, and cut into groups of one query length and similar contexts, so a short context
  is not padded to the longest one. Each group reads its blocks with one `index_select` per side (whole
  blocks, contiguous copies) into a scratch buffer small enough to stay in the core's cache, then runs
  one `scaled_dot_product_attention` for the whole group. GQA costs no copies there: the `group_size`
  query heads that share a KV head become `group_size` query rows of that KV head.
* Long rows (a prompt or a prefill chunk) run one SDPA each, causal over their own context (GQA by
  SDPA's `enable_gqa`).

An engine whose `attention` role replaces a part of the reference backend (`store_kv`, `gather_kv`,
`paged_attention`: phase 03's exercises, mini/roles.py) builds the reference backend holding them instead of
this one (its reference class in mini/roles.py's `attention` role), decided once when the engine is built.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from mini.attention import reference
from mini.attention.metadata import AttentionBackend, AttentionMetadata
from mini.utils import cdiv

__all__ = ["AttentionMetadata", "CpuAttentionBackend", "paged_attention", "store_kv"]

# Rows with at most this many new tokens are "decode-like" and batched (vLLM: reorder_batch_threshold,
# 1 + num_speculative_tokens). Longer rows (prompts, prefill chunks) are attended one by one.
MAX_SHORT_QUERY_LEN = 16
# Short rows are grouped by context length in power-of-two classes; at most this many classes per query
# length, so a decode step makes at most this many gathers and SDPA calls per layer.
NUM_LENGTH_CLASSES = 4
# A group's gathered K and V stay under this size per torch thread (SDPA splits the group's heads over the
# threads, each core with its own cache), so they are still in cache when SDPA reads them.
GROUP_KV_BYTES_PER_THREAD = 1 << 20


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write each token's key/value into its slot (as reference.store_kv): one `index_copy_` per side."""
    num_slots = slot_mapping.shape[0]
    key, value = key[:num_slots], value[:num_slots]
    if bool((slot_mapping < 0).any()):  # padding rows (-1) go nowhere
        is_real = slot_mapping >= 0
        slot_mapping, key, value = slot_mapping[is_real], key[is_real], value[is_real]
    # Flat view of one side: slot s is row s (block s // block_size, offset s % block_size).
    kv_cache[0].flatten(0, 1).index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    kv_cache[1].flatten(0, 1).index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


@dataclass(slots=True)
class ShortGroup:
    """Requests with the same few new tokens whose rows attend together: one gather and one SDPA call."""

    rows: slice  # the group's queries within StepPlan.short_rows: b * q_len rows, request after request
    block_ids: torch.Tensor  # int64 [b * num_blocks]: each request's first num_blocks blocks, row after row
    mask: torch.Tensor | None  # additive [b, 1, G * q_len, L]: 0 where grouped query row r sees key j, else -inf
    num_requests: int
    query_len: int
    context_len: int  # L: the longest context in the group


@dataclass(slots=True)
class LongRequest:
    """One request with many new query rows: causal attention over its own context."""

    start: int
    end: int
    block_ids: torch.Tensor  # int64 [num_blocks]
    mask: torch.Tensor | None  # additive [q_len, seq_len]; None when the rows are the whole context (is_causal)
    seq_len: int


@dataclass(slots=True)
class StepPlan:
    """How one step's batch is cut into groups; built once, read by every layer."""

    short_rows: torch.Tensor  # int64: the flat query rows of all short groups, group after group
    short_groups: list[ShortGroup]
    long_requests: list[LongRequest]
    covers_all_rows: bool


def plan_step(metadata: AttentionMetadata, block_size: int, group_size: int, num_query_rows: int,
              max_group_tokens: int, dtype: torch.dtype = torch.float32) -> StepPlan:
    """Sort the batch into groups of short rows and single long rows (what vLLM's metadata builder does).

    Masks are made additive (0 where a key is visible, -inf elsewhere) in the cache's `dtype` once here:
    given a boolean mask, SDPA would convert it again in every layer.
    """
    starts = metadata.query_start_loc.tolist()
    seq_lens = metadata.seq_lens.tolist()
    query_lens = [end - start for start, end in itertools.pairwise(starts)]
    block_table = metadata.block_table.long()
    long_requests = []
    for req, (start, query_len, seq_len) in enumerate(zip(starts, query_lens, seq_lens, strict=False)):
        if query_len > MAX_SHORT_QUERY_LEN:
            mask = (None if query_len == seq_len
                    else additive(causal_mask(query_len, seq_len, block_table.device), dtype))
            block_ids = block_table[req, : cdiv(seq_len, block_size)]
            long_requests.append(LongRequest(start, start + query_len, block_ids, mask, seq_len))
    # Short rows by (query length, context length), cut into groups of one query length and one length
    # class: class c holds contexts in (longest / 2^(c+1), longest / 2^c], so padding a group to its longest
    # context at most doubles it; the shortest contexts share the last class. Few groups, few calls.
    order = sorted((req for req, q_len in enumerate(query_lens) if 0 < q_len <= MAX_SHORT_QUERY_LEN),
                   key=lambda req: (query_lens[req], seq_lens[req]))
    longest = max((seq_lens[req] for req in order), default=1)
    group_keys = [(query_lens[req], min(NUM_LENGTH_CLASSES - 1, (longest // seq_lens[req]).bit_length() - 1))
                  for req in order]
    bounds: list[int] = []  # group k is order[bounds[k]:bounds[k + 1]]
    for index, req in enumerate(order):
        # Sorted: the newcomer is the group's longest context, so the group gathers size * seq_len tokens.
        if not bounds or group_keys[index] != group_keys[index - 1] \
                or (index - bounds[-1] + 1) * seq_lens[req] > max_group_tokens:
            bounds.append(index)
    bounds.append(len(order))
    # Everything per group is a slice of these (sorted) tensors.
    device = block_table.device
    order_t = torch.tensor(order, dtype=torch.long, device=device)
    first_rows = metadata.query_start_loc.long().index_select(0, order_t)
    sorted_lens = metadata.seq_lens.long().index_select(0, order_t)
    sorted_table = block_table.index_select(0, order_t)
    short_groups, short_rows, num_rows = [], [], 0
    for first, last in itertools.pairwise(bounds):
        query_len, context_len = query_lens[order[first]], seq_lens[order[last - 1]]
        rows = first_rows[first:last]
        if query_len > 1:
            rows = (rows[:, None] + torch.arange(query_len, device=device)).flatten()
        mask = None
        if query_len > 1 or seq_lens[order[first]] < context_len:
            mask = additive(grouped_mask(sorted_lens[first:last], query_len, context_len, group_size), dtype)
        block_ids = sorted_table[first:last, : cdiv(context_len, block_size)].flatten()
        short_groups.append(ShortGroup(slice(num_rows, num_rows + len(rows)), block_ids, mask, last - first,
                                       query_len, context_len))
        short_rows.append(rows)
        num_rows += len(rows)
    short_rows_t = torch.cat(short_rows) if short_rows else first_rows
    return StepPlan(short_rows_t, short_groups, long_requests, covers_all_rows=starts[-1] == num_query_rows)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask as SDPA's additive form: 0.0 where True, -inf where False."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def causal_mask(query_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """bool [q_len, seq_len]: the query rows are the LAST q_len positions; each sees keys up to itself."""
    return torch.ones(query_len, seq_len, dtype=torch.bool, device=device).tril(diagonal=seq_len - query_len)


def grouped_mask(seq_lens: torch.Tensor, query_len: int, context_len: int, group_size: int) -> torch.Tensor:
    """bool [b, 1, G * q_len, L] for the grouped-query layout of `_attend_short_group`.

    Query i of a request with seq_len keys sits at position seq_len - q_len + i and sees keys up to it;
    grouped row g * q_len + i is query head g (of the KV head's group) at query i.
    """
    key_positions = torch.arange(context_len, device=seq_lens.device)
    if query_len == 1:  # decode: one row per head, the same for all G heads (the mask broadcasts)
        return (key_positions < seq_lens[:, None]).view(-1, 1, 1, context_len)
    last_visible = (seq_lens - query_len)[:, None] + torch.arange(query_len, device=seq_lens.device)  # [b, q_len]
    mask = key_positions <= last_visible[:, :, None]  # [b, q_len, L]
    return mask[:, None].expand(-1, group_size, -1, -1).reshape(len(seq_lens), 1, group_size * query_len, -1)


# Per thread (an AsyncLLM engine loop runs in its own thread): the plan of the step being run (its
# metadata is one object shared by every layer of the step), and the gather buffers.
_local = threading.local()


def get_plan(metadata: AttentionMetadata, kv_cache: torch.Tensor, query: torch.Tensor) -> StepPlan:
    """The step's plan, built on the first layer and reused by the others."""
    kv_bytes_per_token = 2 * kv_cache[0, 0, 0].numel() * kv_cache.element_size()
    max_group_tokens = GROUP_KV_BYTES_PER_THREAD * torch.get_num_threads() // kv_bytes_per_token
    group_size = query.shape[1] // kv_cache.shape[3]
    key = (kv_cache.shape[2], group_size, query.shape[0], max_group_tokens, kv_cache.device, kv_cache.dtype)
    cached = getattr(_local, "plan", None)
    if cached is not None and cached[0] is metadata and cached[1] == key:
        return cached[2]
    plan = plan_step(metadata, kv_cache.shape[2], group_size, query.shape[0], max_group_tokens, kv_cache.dtype)
    _local.plan = (metadata, key, plan)
    return plan


def paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Causal attention of the flat query `[T, Hq, D]` over each request's paged K/V -> `[T, Hq, D]`."""
    if query.requires_grad:  # autograd through the paged cache: the reference path keeps the graph
        return reference.paged_attention(query, kv_cache, metadata, scale)
    plan = get_plan(metadata, kv_cache, query)
    output = torch.empty_like(query) if plan.covers_all_rows else torch.zeros_like(query)
    query = query.to(kv_cache.dtype)  # SDPA computes in the cache's dtype (float32 accumulation inside)
    if plan.short_groups:
        rows = query.index_select(0, plan.short_rows)  # every short row, group after group
        outs = [_attend_short_group(rows[group.rows], kv_cache, group, scale) for group in plan.short_groups]
        output.index_copy_(0, plan.short_rows, torch.cat(outs).to(output.dtype))
    for request in plan.long_requests:
        output[request.start:request.end] = _attend_long_request(query, kv_cache, request, scale)
    return output


def _gather_blocks(cache_side: torch.Tensor, block_ids: torch.Tensor, num_rows: int, context_len: int,
                   name: str) -> torch.Tensor:
    """Blocks `block_ids` (row after row) copied into a reused scratch buffer -> `[rows, Hkv, L, D]` view."""
    block_size, num_kv_heads, head_size = cache_side.shape[1:]
    buffer = _scratch(name, block_ids.shape[0] * block_size * num_kv_heads * head_size, cache_side)
    blocks = buffer.view(block_ids.shape[0], block_size, num_kv_heads, head_size)
    torch.index_select(cache_side, 0, block_ids, out=blocks)
    tokens = blocks.view(num_rows, -1, num_kv_heads, head_size)[:, :context_len]
    return tokens.transpose(1, 2)


def _attend_short_group(rows: torch.Tensor, kv_cache: torch.Tensor, group: ShortGroup, scale: float
                        ) -> torch.Tensor:
    """SDPA for a group's query rows `[b * q_len, Hq, D]` (request after request) -> the same shape."""
    num_heads, head_size = rows.shape[1:]
    num_kv_heads = kv_cache.shape[3]
    group_size = num_heads // num_kv_heads
    b, q_len, length = group.num_requests, group.query_len, group.context_len
    keys = _gather_blocks(kv_cache[0], group.block_ids, b, length, "keys")
    values = _gather_blocks(kv_cache[1], group.block_ids, b, length, "values")
    # GQA without copies of K/V: KV head k serves query heads k*G .. k*G+G-1; lay them out as G * q_len
    # query rows of head k (row g * q_len + i is query head k*G+g at query i).
    grouped = rows.view(b, q_len, num_kv_heads, group_size, head_size).permute(0, 2, 3, 1, 4)
    grouped = grouped.reshape(b, num_kv_heads, group_size * q_len, head_size)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=group.mask, scale=scale)
    out = out.view(b, num_kv_heads, group_size, q_len, head_size).permute(0, 3, 1, 2, 4)
    return out.reshape(b * q_len, num_heads, head_size)


def _attend_long_request(query: torch.Tensor, kv_cache: torch.Tensor, request: LongRequest, scale: float
                         ) -> torch.Tensor:
    """SDPA for one request's many rows (GQA by `enable_gqa`) -> `[q_len, Hq, D]`."""
    keys = _gather_blocks(kv_cache[0], request.block_ids, 1, request.seq_len, "keys")
    values = _gather_blocks(kv_cache[1], request.block_ids, 1, request.seq_len, "values")
    rows = query[request.start:request.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=request.mask,
                                         is_causal=request.mask is None, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _scratch(name: str, num_elements: int, like: torch.Tensor) -> torch.Tensor:
    """A flat buffer of at least `num_elements`, kept between calls (no fresh pages on every layer)."""
    buffers = _local.__dict__.setdefault("scratch", {})
    key = (name, like.dtype, like.device, torch.is_inference_mode_enabled())
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < num_elements:
        buffer = torch.empty(num_elements, dtype=like.dtype, device=like.device)
        buffers[key] = buffer
    return buffer[:num_elements]


class CpuAttentionBackend(AttentionBackend):
    """The fast CPU backend ("torch_fast", the default on CPU): same results as `ReferenceAttentionBackend`.

    It has no parts of its own: an engine that replaces a part of the reference backend builds that
    backend instead (the role's reference class for this one, mini/roles.py), so the replacement runs.
    """

    name: ClassVar[str] = "torch_fast"
    store_kv = staticmethod(store_kv)
    paged_attention = staticmethod(paged_attention)
