"""Checks for phase 03 (paged attention in PyTorch), against mini.attention.reference and torch's SDPA.

    check_store_kv(store_kv)
    check_gather_kv(gather_kv)
    check_paged_attention(paged_attention)

The first case of each is the worked example of the phase: block_size 4, a mixed batch of one prefill
chunk (r0: 6 tokens cached, 4 new, blocks [7, 2, 5]) and two decodes (r1 at position 5, blocks [1, 4];
r2 at position 2, block [6]); 4 query heads share 2 KV heads (GQA). paged_attention is compared with
`torch.nn.functional.scaled_dot_product_attention` run on each request's K/V gathered contiguous, in float32
and once in bfloat16 (the output keeps the query's dtype).

vLLM v0.33.0's counterparts: `store_kv` is the CUDA `reshape_and_cache_flash` (csrc/cache_kernels.cu), whose
Triton twin `reshape_and_cache_kernel_flash` (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py) passes
check_store_kv (tests/test_course_vllm_answers_p03.py); `gather_kv` has none (vLLM never gathers the cache);
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


def _random_batch(rng: random.Random) -> dict[str, Any]:
    """A mixed step: each request has some tokens cached and computes 1 (decode) or several new ones."""
    block_size = rng.choice([1, 2, 4, 8, 16])
    num_reqs = rng.randint(1, 5)
    computed, scheduled, block_ids = [], [], []
    lengths = []
    for _ in range(num_reqs):
        total = rng.randint(1, 40)
        num_new = 1 if rng.random() < 0.5 else rng.randint(1, total)
        computed.append(total - num_new)
        scheduled.append(num_new)
        lengths.append(total)
    num_needed = sum(-(-total // block_size) for total in lengths)
    num_blocks = num_needed + 1 + rng.randint(0, 4)  # block 0 is the null block
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    for total in lengths:
        block_ids.append([free.pop() for _ in range(-(-total // block_size))])
    num_kv_heads = rng.choice([1, 2, 4])
    return {
        "block_size": block_size,
        "num_blocks": num_blocks,
        "block_ids": block_ids,
        "num_computed_tokens": computed,
        "num_scheduled_tokens": scheduled,
        "num_heads": num_kv_heads * rng.choice([1, 2, 4]),
        "num_kv_heads": num_kv_heads,
        "head_size": rng.choice([4, 8, 16]),
    }


def _batches(seeds: Iterable[int]) -> list[dict[str, Any]]:
    decode_only = {**WORKED_EXAMPLE, "num_computed_tokens": [9, 5, 2], "num_scheduled_tokens": [1, 1, 1]}
    prefill_only = {**WORKED_EXAMPLE, "num_computed_tokens": [0, 0, 0], "num_scheduled_tokens": [10, 6, 3]}
    return [
        WORKED_EXAMPLE,
        decode_only,
        prefill_only,
        *(_random_batch(random.Random(seed)) for seed in seeds),
    ]


def _metadata(batch: dict[str, Any]) -> AttentionMetadata:
    """The step's metadata as the engine builds it: phase 02's flat batch, then the one metadata builder."""
    computed, scheduled = batch["num_computed_tokens"], batch["num_scheduled_tokens"]
    token_ids = [[0] * (c + s) for c, s in zip(computed, scheduled)]  # attention never reads the token ids
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


def _not_a_tensor(what: str, got: Any, inputs: dict) -> AssertionError:
    return AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}")


# ------------------------------------------------------------------------------------------ store_kv
def _store_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    cases = []
    for index, batch in enumerate(_batches(seeds)):
        case = dict(batch)
        case["pad"] = 0 if index < 3 else index % 3  # a few trailing -1 slots: padded rows, not stored
        case["cache_dtype"] = torch.float16 if index == 2 else torch.float32
        cases.append(case)
    return cases


@graded
def check_store_kv(store_kv: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = _store_cases(seeds)
    for number, case in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        slots = _metadata(case).slot_mapping
        slot_mapping = torch.cat([slots, torch.full((case["pad"],), -1, dtype=torch.int64)])
        num_tokens = slot_mapping.shape[0]
        key = torch.randn(num_tokens, case["num_kv_heads"], case["head_size"], generator=generator)
        value = torch.randn(num_tokens, case["num_kv_heads"], case["head_size"], generator=generator)
        cache = _random_cache(case, generator, case["cache_dtype"])
        expected = cache.clone()
        reference.store_kv(key, value, expected, slot_mapping)
        got = cache.clone()
        inputs = {
            "slot_mapping": slot_mapping.tolist(),
            "kv_cache.shape": list(cache.shape),
            "kv_cache.dtype": str(cache.dtype),
            "key.shape": list(key.shape),
            "key.dtype": str(key.dtype),
        }
        with calling("store_kv", inputs):
            result = store_kv(key.clone(), value.clone(), got, slot_mapping.clone())
        expect_equal(
            "store_kv return value",
            inputs,
            None,
            result,
            "store_kv writes into kv_cache IN PLACE and returns None",
        )
        for side, name in ((0, "keys (kv_cache[0])"), (1, "values (kv_cache[1])")):
            wrong = (got[side] != expected[side]).any(dim=(-1, -2)).nonzero().tolist()
            expect_equal(
                f"store_kv: the cached {name}",
                inputs,
                [],
                wrong,
                "list of [block, offset] whose content is wrong: token t goes to block "
                "slot_mapping[t] // block_size, offset slot_mapping[t] % block_size; slots of -1 are "
                "skipped; every other slot keeps its old content; cast to kv_cache.dtype",
            )
    passed("check_store_kv", len(cases))


# ----------------------------------------------------------------------------------------- gather_kv
@graded
def check_gather_kv(gather_kv: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = []
    for batch in _batches(seeds):
        table = prep.make_block_table(batch["block_ids"])
        meta = _metadata(batch)
        for req in range(len(batch["block_ids"])):
            cases.append((batch, table[req], int(meta.seq_lens[req])))
    for number, (batch, block_ids, seq_len) in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        cache_side = _random_cache(batch, generator)[number % 2]
        expected = reference.gather_kv(cache_side, block_ids, seq_len)
        inputs = {
            "cache_side.shape": list(cache_side.shape),
            "block_ids": block_ids.tolist(),
            "seq_len": seq_len,
        }
        with calling("gather_kv", inputs, expected=expected):
            got = gather_kv(cache_side.clone(), block_ids.clone(), seq_len)
        if not isinstance(got, torch.Tensor):
            raise _not_a_tensor("gather_kv", got, inputs)
        expect_equal(
            "gather_kv shape",
            inputs,
            list(expected.shape),
            list(got.shape),
            "[seq_len, num_kv_heads, head_size]: the request's first seq_len tokens, in order",
        )
        wrong = (got != expected).any(dim=(-1, -2)).nonzero().flatten().tolist()
        expect_equal(
            "gather_kv: token positions with the wrong K/V",
            inputs,
            [],
            wrong,
            "position p lives in block block_ids[p // block_size] at offset p % block_size",
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


@graded
def check_paged_attention(paged_attention: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = [*_batches(seeds), {**WORKED_EXAMPLE, "dtype": torch.bfloat16}]  # the model runs in bf16 too
    for number, batch in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        meta = _metadata(batch)
        dtype = batch.get("dtype", torch.float32)
        kv_cache = _random_cache(batch, generator, dtype)  # unused slots hold random junk: it must not leak in
        query = torch.randn(
            meta.num_actual_tokens, batch["num_heads"], batch["head_size"], generator=generator
        ).to(dtype)
        scale = batch["head_size"] ** -0.5
        expected = sdpa_reference(query.float(), kv_cache.float(), meta, scale).to(dtype)
        inputs = {**_shown(batch), "dtype": str(dtype)}
        with calling("paged_attention", inputs, expected=expected):
            got = paged_attention(query.clone(), kv_cache.clone(), meta, scale)
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
        error = (got.float() - expected.float()).abs().amax(dim=(-1, -2))
        wrong = (error > (1e-4 if dtype == torch.float32 else 2e-2)).nonzero().flatten().tolist()
        expect_equal(
            "paged_attention: flat query rows that differ from SDPA on gathered K/V",
            inputs,
            [],
            wrong,
            "row t of request i sits at position seq_lens[i] - q_len + (t - query_start_loc[i]) and "
            "attends to positions 0..that position of its own request; query head h reads KV "
            "head h // (num_heads // num_kv_heads); softmax(q.k * scale) @ v",
        )
    passed("check_paged_attention", len(cases))


PHASE = Phase("03_paged_attention", (
    Exercise("store_kv", check_store_kv, points=3, grade_id="test-store-kv", part="store_kv"),
    Exercise("gather_kv", check_gather_kv, points=2, grade_id="test-gather-kv", part="gather_kv"),
    Exercise("paged_attention", check_paged_attention, points=5, grade_id="test-paged-attention", part="paged_attention"),
))
