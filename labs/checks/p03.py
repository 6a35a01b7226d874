"""Checks for phase 03 (paged attention in PyTorch), against mini.attention.reference and torch's SDPA.

    check_store_kv(store_kv)
    check_gather_kv(gather_kv)
    check_paged_attention(paged_attention)

The first case of each is the worked example of the phase: block_size 4, a mixed batch of one prefill
chunk (r0: 6 tokens cached, 4 new, blocks [7, 2, 5]) and two decodes (r1 at position 5, blocks [1, 4];
r2 at position 2, block [6]); 4 query heads share 2 KV heads (GQA). Then the cases a real engine meets and
a tidy example hides: SmolLM2's head layout (9 query heads over 3 KV heads), a block size that is no power of
two (12, which `LLM` accepts), a mixed batch holding a prompt, two 2-token requests (a short prompt, and a
chunk such as a speculative step's), a decode and a chunk that ends exactly on a block boundary; a `scale`
other than `head_size ** -0.5` (models set their own); query, key and value that are views into wider
buffers (vLLM's are slices of one fused qkv projection), key and value with different strides; `-1`
slots anywhere in the batch (padding rows, and a drafter's slots past the end of the model) and a real
slot 0; float16 and bfloat16 inputs. Then seeded random batches. paged_attention is compared with
`torch.nn.functional.scaled_dot_product_attention` run in float32 on each request's K/V gathered contiguous;
in half precision the output must be that float32 result rounded once (the bits of float32 math).

vLLM v0.33.0's counterparts: `store_kv` is the CUDA `reshape_and_cache_flash` (csrc/cache_kernels.cu), whose
Triton twin `reshape_and_cache_kernel_flash` (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py) passes
check_store_kv (tests/course/vllm_answers/test_p03.py); `gather_kv` has none (vLLM never gathers the cache);
`paged_attention` exists only as GPU kernels (FlashAttention, `kernel_unified_attention`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_equal, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.attention import reference
from mini.attention.metadata import AttentionMetadata, build_attention_metadata
from mini.worker import prepare_inputs as prep

WORKED_EXAMPLE = {
    "block_size": 4,
    "num_blocks": 8,
    "block_ids": [[7, 2, 5], [1, 4], [6]],
    "num_computed_tokens": [6, 5, 2],
    "num_scheduled_tokens": [4, 1, 1],
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_size": 8,
}

# SmolLM2's layout (9 query heads over 3 KV heads), block_size 12: a 7-token prompt, a 2-token chunk over 15
# cached tokens (a speculative step's shape), a decode at position 25, a 2-token prompt, and a 3-token chunk
# that fills its block exactly. scale 0.2, not head_size ** -0.5 = 0.354.
MIXED_GQA3 = {
    "block_size": 12,
    "num_blocks": 9,
    "block_ids": [[4], [7, 2], [8, 1, 6], [3], [5]],
    "num_computed_tokens": [0, 15, 25, 0, 9],
    "num_scheduled_tokens": [7, 2, 1, 2, 3],
    "num_heads": 9,
    "num_kv_heads": 3,
    "head_size": 8,
    "scale": 0.2,
}

_HALF = (torch.float16, torch.bfloat16)


def _random_batch(rng: random.Random) -> dict[str, Any]:
    """A mixed step: each request has some tokens cached and computes 1 (decode), 2 or several new ones."""
    block_size = rng.choice([1, 2, 3, 4, 5, 8, 12, 16])
    num_reqs = rng.randint(1, 5)
    computed, scheduled, block_ids = [], [], []
    lengths = []
    for _ in range(num_reqs):
        total = rng.randint(1, 40)
        draw = rng.random()
        num_new = 1 if draw < 0.4 else min(2, total) if draw < 0.6 else rng.randint(1, total)
        computed.append(total - num_new)
        scheduled.append(num_new)
        lengths.append(total)
    num_needed = sum(-(-total // block_size) for total in lengths)
    num_blocks = num_needed + 1 + rng.randint(0, 4)  # block 0 is the null block
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    for total in lengths:
        block_ids.append([free.pop() for _ in range(-(-total // block_size))])
    num_kv_heads = rng.choice([1, 2, 3, 4])
    head_size = rng.choice([4, 8, 16])
    return {
        "block_size": block_size,
        "num_blocks": num_blocks,
        "block_ids": block_ids,
        "num_computed_tokens": computed,
        "num_scheduled_tokens": scheduled,
        "num_heads": num_kv_heads * rng.choice([1, 2, 3, 4]),
        "num_kv_heads": num_kv_heads,
        "head_size": head_size,
        "scale": rng.choice([None, None, 0.1, 0.25, 0.6]),
    }


def _batches(seeds: Iterable[int]) -> list[dict[str, Any]]:
    decode_only = {**WORKED_EXAMPLE, "num_computed_tokens": [9, 5, 2], "num_scheduled_tokens": [1, 1, 1]}
    prefill_only = {**WORKED_EXAMPLE, "num_computed_tokens": [0, 0, 0], "num_scheduled_tokens": [10, 6, 3]}
    return [
        WORKED_EXAMPLE,
        decode_only,
        prefill_only,
        MIXED_GQA3,
        *(_random_batch(random.Random(seed)) for seed in seeds),
    ]


def _scale(batch: dict[str, Any]) -> float:
    scale = batch.get("scale")
    return batch["head_size"] ** -0.5 if scale is None else scale


def _metadata(batch: dict[str, Any]) -> AttentionMetadata:
    """The step's metadata as the engine builds it: phase 02's flat batch, then the one metadata builder."""
    computed, scheduled = batch["num_computed_tokens"], batch["num_scheduled_tokens"]
    token_ids = [[0] * (c + s) for c, s in zip(computed, scheduled,
                                               strict=False)]  # attention never reads the token ids
    return build_attention_metadata(
        prep.prepare_inputs(token_ids, computed, scheduled, batch["block_ids"], batch["block_size"]))


def _shown(batch: dict[str, Any]) -> dict[str, Any]:
    """The readable part of a case (the tensors themselves are random numbers)."""
    meta = _metadata(batch)
    return {
        "block_size": batch["block_size"],
        "block_table": batch["block_ids"],
        "query_start_loc": meta.query_start_loc.tolist(),
        "seq_lens": meta.seq_lens.tolist(),
        "num_heads": batch["num_heads"],
        "num_kv_heads": batch["num_kv_heads"],
        "head_size": batch["head_size"],
    }


def _random_cache(batch: dict[str, Any], generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    shape = (2, batch["num_blocks"], batch["block_size"], batch["num_kv_heads"], batch["head_size"])
    return torch.randn(shape, generator=generator).to(dtype)


def _view_in_wider_buffer(values: torch.Tensor, before: int, after: int, seed: int) -> torch.Tensor:
    """A NEW tensor equal to `values` `[rows, heads, head_size]`, laid out as columns `before ..` of a wider
    `[rows, before + heads * head_size + after]` buffer (random junk around it): not contiguous, its row stride
    `before + heads * head_size + after` (what slicing one fused qkv projection gives)."""
    rows, heads, head_size = values.shape
    width = heads * head_size
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(rows, before + width + after, generator=generator).to(values.dtype)
    buffer[:, before:before + width] = values.reshape(rows, width)
    return buffer[:, before:before + width].view(rows, heads, head_size)


def _layout(tensor: torch.Tensor) -> str:
    return f"{list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}, strides {list(tensor.stride())}" + (
        "" if tensor.is_contiguous() else " (a view, not contiguous)")


def _not_a_tensor(what: str, got: Any, inputs: dict) -> AssertionError:
    return AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}")


_STRIDED_HINT = (
    "run the same call in a notebook cell with these inputs: the traceback shows which of your lines raised. "
    "The inputs here are views into wider buffers (vLLM's query, key and value are slices of one fused qkv "
    "projection), not contiguous: `.view` cannot merge their token dim with another (`.reshape` or indexing "
    "can), and key and value have different strides"
)
_STORE_RAISE_HINT = _STRIDED_HINT + (
    ". An IndexError usually means a slot was split into block and offset with the wrong block_size (the cache "
    "is [2, num_blocks, block_size, num_kv_heads, head_size]) or the two parts were swapped"
)


# ------------------------------------------------------------------------------------------ store_kv
# Slots typed in, not derived from a batch: slot 0 (block 0, offset 0) is a real slot to the cache write, and
# -1 rows sit in the middle (a drafter's slots past max_model_len) as well as at the end (CUDA-graph padding).
SLOT_ZERO_CASE = {
    "block_size": 12, "num_blocks": 4, "num_kv_heads": 3, "head_size": 4,
    "slots": [5, 0, -1, 13, 46, -1, 12, 36, 11, -1],
}


def _store_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    """Each case: the slot mapping (with -1 rows), the cache's shape and dtype, the key/value dtype."""
    cases = []
    for index, batch in enumerate(_batches(seeds)):
        slots = _metadata(batch).slot_mapping.tolist()
        rng = random.Random(1000 + index)
        if index == 3:  # MIXED_GQA3: -1 rows between requests and inside one, and at the end
            slots = [*slots[:2], -1, *slots[2:8], -1, *slots[8:], -1]
        elif index > 3:
            for _ in range(index % 4):
                slots.insert(rng.randint(0, len(slots)), -1)
        cache_dtype, key_dtype = [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                  (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)][index % 4]
        if index == 0:
            cache_dtype = key_dtype = torch.float32
        cases.append({**batch, "slots": slots, "cache_dtype": cache_dtype, "key_dtype": key_dtype})
        if index == 3:
            cases.append({**SLOT_ZERO_CASE, "cache_dtype": torch.float16, "key_dtype": torch.float32})
    return cases


def _describe_slot(side: int, block: int, offset: int, content: torch.Tensor, old: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, slot_mapping: list[int], block_size: int) -> str:
    """What a slot of the cache holds, in words: a token's key or value (cast to the cache's dtype), or its old
    content."""
    slot = block * block_size + offset
    if torch.equal(content, old):
        return f"slot {slot} (block {block}, offset {offset}) holds its old content (nothing written there)"
    names = ("key", "value")
    for source_side, source in ((side, (key, value)[side]), (1 - side, (key, value)[1 - side])):
        for token in range(source.shape[0]):
            if torch.equal(content, source[token].to(content.dtype)):
                own = slot_mapping[token] if token < len(slot_mapping) else "none"
                return (f"slot {slot} (block {block}, offset {offset}) holds token {token}'s {names[source_side]} "
                        f"(slot_mapping[{token}] = {own})")
    return f"slot {slot} (block {block}, offset {offset}) holds values that are no token's {names[side]}"


def _store_kv_hint(side: int, block: int, offset: int, expected_text: str, got_text: str,
                   slot_mapping: list[int], block_size: int) -> str:
    """The rule the first wrong slot breaks."""
    slot = block * block_size + offset
    names = ("keys", "values")
    writers = [t for t, s in enumerate(slot_mapping) if s == slot]
    if "'s value" in got_text and side == 0 or "'s key" in got_text and side == 1:
        return f"kv_cache[0] holds the keys and kv_cache[1] the values: the {names[side]} landed on the wrong side"
    if writers and "old content" in got_text:
        token = writers[-1]
        if slot == 0:
            return ("slot 0 is a real slot (block 0, offset 0): only -1 means padding; a test such as "
                    "'slot > 0' or a truth test of the slot drops it")
        pads_before = [t for t in range(token) if slot_mapping[t] < 0]
        if pads_before:
            return (f"token {token} comes after a -1 row (index {pads_before[0]}): -1 marks ONE padding row, "
                    f"not the end of the batch (a drafter's slots past the model's end and CUDA-graph padding "
                    f"put -1 anywhere); keep going past it")
        return f"token {token} has slot {slot} and was never written: every row whose slot is >= 0 is stored"
    if not writers and "slot_mapping[" in got_text:
        token = int(got_text.split("token ")[1].split("'")[0])
        if slot_mapping[token] < 0:
            return (f"token {token}'s slot is -1 (padding): nothing is written for it, not even into the null "
                    f"block; note that -1 used as an index reaches the LAST block and offset of the cache")
    if "slot_mapping[" in got_text:
        return (f"the token that landed here belongs elsewhere: a slot is a flat index over (block, offset), "
                f"block_size = {block_size} slots per block (kv_cache.shape[2])")
    return ("every row whose slot is >= 0 puts its key in kv_cache[0] and its value in kv_cache[1] at that slot, "
            "cast to the cache's dtype; every other slot keeps its content")


@graded
def check_store_kv(store_kv: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = _store_cases(seeds)
    for number, case in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        slot_mapping = torch.tensor(case["slots"], dtype=torch.int64)
        num_tokens, heads, head_size = slot_mapping.shape[0], case["num_kv_heads"], case["head_size"]
        key = torch.randn(num_tokens, heads, head_size, generator=generator).to(case["key_dtype"])
        value = torch.randn(num_tokens, heads, head_size, generator=generator).to(case["key_dtype"])
        cache = _random_cache(case, generator, case["cache_dtype"])
        expected = cache.clone()
        reference.store_kv(key, value, expected, slot_mapping)
        got = cache.clone()
        # key: a slice of a fused qkv row; value: of another buffer, with a different row stride (half the cases)
        given_key = _view_in_wider_buffer(key, 2 * heads * head_size, 3, seed=number)
        given_value = (_view_in_wider_buffer(value, heads * head_size, 0, seed=number + 1) if number % 2
                       else value.clone())
        given_slots = slot_mapping.clone()
        inputs = {
            "slot_mapping": case["slots"],
            "kv_cache": f"{list(cache.shape)} {str(cache.dtype).removeprefix('torch.')} (block_size "
                        f"{case['block_size']})",
            "key": _layout(given_key),
            "value": _layout(given_value),
        }
        with calling("store_kv", inputs, hint=_STORE_RAISE_HINT):
            result = store_kv(given_key, given_value, got, given_slots)
        expect_equal(
            "store_kv return value",
            inputs,
            None,
            result if result is None or not isinstance(result, torch.Tensor) else f"a tensor {list(result.shape)}",
            "store_kv writes into kv_cache IN PLACE and returns None (the model keeps using the kv_cache it "
            "passed in: a returned copy is lost)",
        )
        for name, given, original in (("slot_mapping", given_slots, slot_mapping), ("key", given_key, key),
                                      ("value", given_value, value)):
            expect_equal(
                f"store_kv: its input `{name}` after the call",
                inputs,
                "unchanged",
                "unchanged" if torch.equal(given, original) else "modified in place",
                "every layer of the model calls store_kv with the SAME slot_mapping, and the caller still owns "
                "key and value: read them, never write them",
            )
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise AssertionError(f"store_kv changed the cache tensor itself (now {list(got.shape)} {got.dtype})"
                                 f"\n  inputs: {inputs}")
        for side, name in ((0, "keys (kv_cache[0])"), (1, "values (kv_cache[1])")):
            wrong = (got[side] != expected[side]).any(dim=(-1, -2)).nonzero().tolist()
            if not wrong:
                continue
            block, offset = wrong[0]
            args = (key, value, case["slots"], case["block_size"])
            expected_text = _describe_slot(side, block, offset, expected[side, block, offset],
                                           cache[side, block, offset], *args)
            got_text = _describe_slot(side, block, offset, got[side, block, offset], cache[side, block, offset],
                                      *args)
            expect_equal(
                f"store_kv: the cached {name} at the first wrong slot (every wrong [block, offset]: {wrong[:12]}"
                + (" ..." if len(wrong) > 12 else "") + ")",
                inputs,
                expected_text,
                got_text,
                _store_kv_hint(side, block, offset, expected_text, got_text, case["slots"], case["block_size"]),
            )
    passed("check_store_kv", len(cases))


# ----------------------------------------------------------------------------------------- gather_kv
_GATHER_RAISE_HINT = (
    "run the same call in a notebook cell with these inputs: the traceback shows which of your lines raised. "
    "An IndexError usually means a position was split into block and offset the wrong way round, or with "
    "block_size read from the wrong dim (cache_side is [num_blocks, block_size, num_kv_heads, head_size])"
)

@graded
def check_gather_kv(gather_kv: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = []
    for batch_number, batch in enumerate(_batches(seeds)):
        table = prep.make_block_table(batch["block_ids"])
        meta = _metadata(batch)
        dtype = (torch.float32, torch.float32, torch.float16, torch.bfloat16)[batch_number % 4]
        for req in range(len(batch["block_ids"])):
            cases.append((batch, table[req], int(meta.seq_lens[req]), dtype))
    for number, (batch, block_ids, seq_len, dtype) in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        cache_side = _random_cache(batch, generator, dtype)[number % 2]
        expected = reference.gather_kv(cache_side, block_ids, seq_len)
        inputs = {
            "cache_side": f"{list(cache_side.shape)} {str(dtype).removeprefix('torch.')} "
                          f"(block_size {cache_side.shape[1]}, {cache_side.shape[2]} KV heads)",
            "block_ids": block_ids.tolist(),
            "seq_len": seq_len,
        }
        with calling("gather_kv", inputs, expected=f"a tensor {list(expected.shape)}", hint=_GATHER_RAISE_HINT):
            got = gather_kv(cache_side.clone(), block_ids.clone(), seq_len)
        if not isinstance(got, torch.Tensor):
            raise _not_a_tensor("gather_kv", got, inputs)
        expect_equal(
            "gather_kv shape",
            inputs,
            list(expected.shape),
            list(got.shape),
            "[seq_len, num_kv_heads, head_size]: the request's first seq_len tokens, in order, which take "
            "ceil(seq_len / block_size) blocks (block_size is cache_side.shape[1]; the last block may be partly "
            "used)",
        )
        wrong = (got.to(expected.dtype) != expected).any(dim=(-1, -2)).nonzero().flatten().tolist()
        if wrong:
            position = wrong[0]
            block_size = cache_side.shape[1]
            flat = cache_side.flatten(0, 1)
            found = [s for s in range(flat.shape[0]) if torch.equal(flat[s], got[position].to(dtype))]
            got_from = (f"slot {found[0]} (block {found[0] // block_size}, offset {found[0] % block_size})"
                        if found else "no slot of cache_side")
            right = int(block_ids[position // block_size])
            expect_equal(
                f"gather_kv: token positions with the wrong K/V: {wrong[:16]}" + (" ..." if len(wrong) > 16 else "")
                + f"; position {position} comes from",
                inputs,
                f"block {right}, offset {position % block_size} (entry {position // block_size} of block_ids)",
                got_from,
                f"positions run through the request's blocks in block-table order, block_size = "
                f"{block_size} of them per block (cache_side.shape[1]); the cache's other dims are KV heads "
                f"and head_size",
            )
        expect_equal(
            "gather_kv dtype",
            inputs,
            expected.dtype,
            got.dtype,
            "the values are right: keep the cache's dtype (gathering is a copy, not a conversion; the attention "
            "upcasts what it computes with, and a float32 copy of a long context costs twice the memory)",
        )
    passed("check_gather_kv", len(cases))


# ----------------------------------------------------------------------------------- paged_attention
def sdpa_reference(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """The same attention with torch's SDPA on each request's K/V gathered contiguous (not paged)."""
    output = torch.zeros_like(query)
    starts = metadata.query_start_loc.tolist()
    for req, seq_len in enumerate(metadata.seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        keys = reference.gather_kv(kv_cache[0], metadata.block_table[req], seq_len)
        values = reference.gather_kv(kv_cache[1], metadata.block_table[req], seq_len)
        group = query.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, seq_len, D]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        allowed = torch.arange(seq_len)[None, :] <= query_positions[:, None]  # [q_len, seq_len]
        out = torch.nn.functional.scaled_dot_product_attention(
            query[start:end].transpose(0, 1), keys, values, attn_mask=allowed, scale=scale
        )
        output[start:end] = out.transpose(0, 1)
    return output


def _misread_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                       mask: str = "causal", heads: str = "grouped", whole_blocks: bool = False) -> torch.Tensor:
    """Attention as a plausible misreading computes it, in float32: `mask` "none" (every row sees the whole
    context) or "from_zero" (row j of a request sees positions 0..j, as if nothing were cached); `heads`
    "interleaved" (query head h reads KV head h % num_kv_heads); `whole_blocks`: the context runs to the end of
    the request's last block (the stale slots past seq_len included)."""
    block_size = kv_cache.shape[2]
    query, kv_cache = query.float(), kv_cache.float()
    output = torch.zeros_like(query)
    starts = metadata.query_start_loc.tolist()
    for req, real_len in enumerate(metadata.seq_lens.tolist()):
        start, end = starts[req], starts[req + 1]
        seq_len = -(-real_len // block_size) * block_size if whole_blocks else real_len
        keys = reference.gather_kv(kv_cache[0], metadata.block_table[req], seq_len)
        values = reference.gather_kv(kv_cache[1], metadata.block_table[req], seq_len)
        group = query.shape[1] // keys.shape[1]
        if heads == "interleaved":
            keys, values = keys.repeat(1, group, 1), values.repeat(1, group, 1)
        else:
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        first = {"causal": real_len - (end - start), "from_zero": 0}.get(mask, real_len)
        rows = torch.arange(first, first + end - start)
        hidden = torch.arange(seq_len)[None, :] > rows[:, None] if mask != "none" else torch.zeros(
            end - start, seq_len, dtype=torch.bool)
        scores = torch.einsum("qhd,khd->hqk", query[start:end], keys) * scale
        probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
        output[start:end] = torch.einsum("hqk,khd->qhd", probs, values)
    return output


def _rows_close(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per flat row: float32 rows within 1e-4; half-precision rows equal to the float32 result rounded ONCE
    (within half a unit in the last place, plus a hair)."""
    error = (got.float() - exact.float()).abs()
    if dtype == torch.float32:
        return (error <= 1e-4).flatten(1).all(dim=1)
    relative = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype] * 1.02
    return (error <= relative * exact.float().abs() + 1e-5).flatten(1).all(dim=1)


def _paged_attention_hint(got: torch.Tensor, wrong: list[int], query: torch.Tensor, kv_cache: torch.Tensor,
                          meta: AttentionMetadata, batch: dict[str, Any], scale: float, dtype: torch.dtype,
                          exact: torch.Tensor) -> str:
    """Where the first wrong row sits, and which misreading (if any) the wrong rows match."""
    starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    row = wrong[0]
    req = max(i for i in range(len(seq_lens)) if starts[i] <= row)
    q_len, seq_len = starts[req + 1] - starts[req], seq_lens[req]
    kind = "decode" if q_len == 1 else "prefill" if q_len == seq_len else "prefill chunk"
    where = (f"row {row} is new token {row - starts[req]} of request {req} ({kind}: {q_len} new of {seq_len} "
             f"tokens), off by up to {float((got[row].float() - exact[row].float()).abs().max()):.4g}. The ")
    rows = torch.tensor(wrong)
    loose = torch.float32 if dtype == torch.float32 else torch.bfloat16
    misreadings = []
    default_scale = batch["head_size"] ** -0.5
    if abs(scale - default_scale) > 1e-9:
        misreadings.append(({"scale": default_scale},
                            (f"wrong rows match attention with scale head_size ** -0.5 = {default_scale:.4g}, "
                            f"not the `scale` argument ({scale:.4g}): models set their own (some multiply in a "
                            f"softcap or a query pre-scale), so use the one you are given")))
    misreadings += [
        ({"mask": "none"}, ("wrong rows attend to LATER positions of their request: every request with "
                            "more than one new token needs the causal mask, a 2-token prompt or chunk too")),
        ({"mask": "from_zero"}, ("wrong rows see positions as if their request had nothing cached: the new "
                                 "tokens are the LAST q_len of the request's seq_len tokens")),
        ({"mask": "none", "whole_blocks": True},
         ("wrong rows also read the slots past seq_len in their request's last block (stale entries of "
         "earlier requests): a request's context is exactly its first seq_len positions, whole blocks are not")),
        ({"heads": "interleaved"}, ("wrong rows read the wrong KV head: consecutive query heads share a KV "
                                    "head (with 2 KV heads and 4 query heads, heads 0 and 1 read KV head 0)")),
    ]
    for options, text in misreadings:
        options = {"scale": scale, **options}
        guess = _misread_attention(query, kv_cache, meta, **options)
        if bool(_rows_close(got[rows], guess[rows], loose).all()):
            return where + text
    if dtype != torch.float32 and bool((got[rows].float() - exact[rows].float()).abs().max() < 0.1):
        return where + (f"rows are a few {str(dtype).removeprefix('torch.')} roundings away from float32 "
                        "math rounded once (the float32 cases passed): upcast query, keys and values, "
                        "compute scores, softmax and the weighted sum in float32, cast once at the end")
    return where + ("rows must each attend, with `scale`, to the positions of their own request up to their own, "
                    "read through the request's blocks; each query head reads the KV head of its group")


@graded
def check_paged_attention(paged_attention: Callable, seeds: Iterable[int] = range(20)) -> None:
    batches = _batches(seeds)
    half = [{**WORKED_EXAMPLE, "dtype": torch.bfloat16}, {**MIXED_GQA3, "dtype": torch.bfloat16},
            {**MIXED_GQA3, "dtype": torch.float16, "scale": 0.5}]  # the model runs in half precision too
    cases = [*batches, *half]
    for number, batch in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        meta = _metadata(batch)
        dtype = batch.get("dtype", torch.float32)
        kv_cache = _random_cache(batch, generator, dtype)  # unused slots hold random junk: it must not leak in
        query = torch.randn(
            meta.num_actual_tokens, batch["num_heads"], batch["head_size"], generator=generator
        ).to(dtype)
        scale = _scale(batch)
        exact = sdpa_reference(query.float(), kv_cache.float(), meta, scale)
        expected = exact.to(dtype)
        num_kv = batch["num_kv_heads"] * batch["head_size"]
        given_query = _view_in_wider_buffer(query, 0, 2 * num_kv, seed=number)  # the q part of a qkv row
        inputs = {**_shown(batch), "scale": scale, "query": _layout(given_query)}
        with calling("paged_attention", inputs, expected=f"a tensor {list(expected.shape)} {dtype}",
                     hint=_STRIDED_HINT):
            got = paged_attention(given_query, kv_cache.clone(), meta, scale)
        if not isinstance(got, torch.Tensor):
            raise _not_a_tensor("paged_attention", got, inputs)
        expect_equal(
            "paged_attention output shape",
            inputs,
            list(expected.shape),
            list(got.shape),
            "one output row per query row: [num_tokens, num_heads, head_size]",
        )
        expect_equal(
            "paged_attention output dtype", inputs, expected.dtype, got.dtype, "return the query's dtype"
        )
        wrong = (~_rows_close(got, exact, dtype)).nonzero().flatten().tolist()
        if wrong:
            expect_equal(
                "paged_attention: flat query rows that differ from SDPA on gathered K/V",
                inputs,
                [],
                wrong,
                _paged_attention_hint(got, wrong, query, kv_cache, meta, batch, scale, dtype, exact),
            )
    passed("check_paged_attention", len(cases))


PHASE = Phase("03_paged_attention", (
    Exercise("store_kv", check_store_kv, points=3, grade_id="test-store-kv", part="store_kv"),
    Exercise("gather_kv", check_gather_kv, points=2, grade_id="test-gather-kv", part="gather_kv"),
    Exercise("paged_attention", check_paged_attention, points=5, grade_id="test-paged-attention",
             part="paged_attention",
             design="the per-request causal attention: where each new token sits in its request and which "
                    "positions it may read, derived from the mask examples; how to cut the flat batch"),
))
