"""Triton paged-attention kernels (mini/attention/triton_paged.py) against PyTorch oracles.

Without a GPU the kernels run under TRITON_INTERPRET=1, so shapes are tiny. Tolerances (atol = rtol),
against a float64 oracle computed from the same (rounded) inputs: float32 1e-5; float16 2e-3 and
bfloat16 2e-2 under the interpreter (fp32 math, only the output is rounded); on a GPU, where the prefill
kernel feeds half-precision probabilities to the tensor cores, float16 1e-2 and bfloat16 3e-2.
store_kv is a copy, so it must be exact.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)
from patience import RUN_GUARD_S

from mini.attention import reference, triton_paged  # a real failure here, never a skip

AttentionMetadata = reference.AttentionMetadata

DEVICE = "cuda" if torch.cuda.is_available() and not triton_utils.use_interpreter() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
if DEVICE == "cuda":
    TOLERANCE.update({torch.float16: 1e-2, torch.bfloat16: 3e-2})


def make_batch(
    seq_lens: list[int], query_lens: list[int], *, block_size: int, num_kv_heads: int, group_size: int,
    head_size: int = 16, dtype: torch.dtype = torch.float32, num_padding_tokens: int = 0, seed: int = 0,
):
    """A random paged cache holding every request's context, blocks scattered in random order.

    Returns (query, key, value, kv_cache, metadata) where key/value are the new tokens' K/V (not yet
    stored) and metadata.slot_mapping says where they go; padding rows get slot -1.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [-(-seq_len // block_size) for seq_len in seq_lens]
    num_blocks = sum(blocks_per_request) + 3  # + null block 0 + two spare blocks
    shuffled = random.Random(seed).sample(range(1, num_blocks), sum(blocks_per_request))
    block_table = torch.zeros(len(seq_lens), max(blocks_per_request), dtype=torch.int32)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=generator)
    slots = []
    rows = zip(seq_lens, query_lens, blocks_per_request, strict=False)
    for row, (seq_len, query_len, num_req_blocks) in enumerate(rows):
        block_ids = [shuffled.pop() for _ in range(num_req_blocks)]
        block_table[row, :num_req_blocks] = torch.tensor(block_ids, dtype=torch.int32)
        for position in range(seq_len - query_len, seq_len):
            slots.append(block_ids[position // block_size] * block_size + position % block_size)
    num_tokens = sum(query_lens)
    total_rows = num_tokens + num_padding_tokens
    num_heads = num_kv_heads * group_size
    query = torch.randn(total_rows, num_heads, head_size, generator=generator)
    key = torch.randn(total_rows, num_kv_heads, head_size, generator=generator)
    value = torch.randn(total_rows, num_kv_heads, head_size, generator=generator)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        query_start_loc=query_start_loc.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=block_table.to(DEVICE),
        slot_mapping=torch.tensor(slots + [-1] * num_padding_tokens, dtype=torch.int64, device=DEVICE),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    to = {"device": DEVICE, "dtype": dtype}
    return query.to(**to), key.to(**to), value.to(**to), kv_cache.to(**to), metadata


def oracle_attention(query, kv_cache, metadata, scale):
    """Float64 oracle: gather each request's K/V through its block table, causal softmax with an offset."""
    output = torch.zeros(query.shape, dtype=torch.float64)
    block_size, num_kv_heads, head_size = kv_cache.shape[2:]
    group_size = query.shape[1] // num_kv_heads
    flat_cache = kv_cache.double().cpu().reshape(2, -1, num_kv_heads, head_size)
    starts, seq_lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
    block_table = metadata.block_table.cpu().long()
    for row, seq_len in enumerate(seq_lens):
        start, end = starts[row], starts[row + 1]
        positions = torch.arange(seq_len)
        slots = block_table[row, positions // block_size] * block_size + positions % block_size
        keys = flat_cache[0, slots].repeat_interleave(group_size, dim=1)
        values = flat_cache[1, slots].repeat_interleave(group_size, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].double().cpu(), keys) * scale
        query_positions = torch.arange(seq_len - (end - start), seq_len)
        scores = scores.masked_fill(positions[None, None, :] > query_positions[None, :, None], float("-inf"))
        output[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
    return output


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=tolerance, rtol=tolerance)


def run_step(query, key, value, kv_cache, metadata, scale):
    """What one attention layer does: store the new K/V, then attend."""
    triton_paged.store_kv(key, value, kv_cache, metadata.slot_mapping)
    return triton_paged.paged_attention(query, kv_cache, metadata, scale)


# ---------------------------------------------------------------- store_kv


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_writes_slots_and_skips_padding(block_size, dtype):
    _, key, value, kv_cache, metadata = make_batch(
        [5, 9, 16], [5, 2, 3], block_size=block_size, num_kv_heads=3, group_size=1, head_size=24,
        dtype=dtype, num_padding_tokens=2,
    )
    expected = kv_cache.clone()
    reference.store_kv(key, value, expected, metadata.slot_mapping)
    before = kv_cache.clone()
    triton_paged.store_kv(key, value, kv_cache, metadata.slot_mapping)
    assert torch.equal(kv_cache, expected)
    changed_slots = (kv_cache != before).reshape(2, -1, 3 * 24).any(dim=-1).any(dim=0).nonzero().flatten()
    real_slots = metadata.slot_mapping[metadata.slot_mapping >= 0].sort().values
    assert torch.equal(changed_slots.cpu(), real_slots.cpu())  # padding (-1) wrote nothing


def test_store_kv_accepts_strided_key_value():
    _, key, value, kv_cache, metadata = make_batch([6], [6], block_size=4, num_kv_heads=2, group_size=1)
    fused = torch.cat([key, value], dim=1)  # [T, 2 * Hkv, D]: key/value are non-contiguous views
    triton_paged.store_kv(fused[:, :2], fused[:, 2:], kv_cache, metadata.slot_mapping)
    flat = kv_cache.reshape(2, -1, 2, 16)
    assert torch.equal(flat[0, metadata.slot_mapping], key) and torch.equal(flat[1, metadata.slot_mapping], value)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_decode_matches_oracle_float32(block_size, group_size):
    # a lone token, exact block multiples, ragged, and one spanning several kernel tiles (online softmax)
    seq_lens = [1, block_size, 2 * block_size, 7, 19, 70]
    batch = make_batch(seq_lens, [1] * len(seq_lens), block_size=block_size, num_kv_heads=2, group_size=group_size)
    query, key, value, kv_cache, metadata = batch
    output = run_step(query, key, value, kv_cache, metadata, scale=0.25)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.25), torch.float32)
    assert_close(output, reference.paged_attention(query, kv_cache, metadata, 0.25), torch.float32)


# The split decode (segments of the context, then their merge) against the single-pass kernel (0) and the
# oracle: one segment, a few, and more segments than tiles (empty segments must weigh nothing).
@pytest.mark.parametrize("num_segments", [0, 1, 3, 16])
@pytest.mark.parametrize("group_size", [1, 3])
def test_split_decode_segments_match_oracle_float32(num_segments, group_size):
    seq_lens = [1, 5, 33, 70]
    query, key, value, kv_cache, metadata = make_batch(
        seq_lens, [1] * len(seq_lens), block_size=4, num_kv_heads=2, group_size=group_size, num_padding_tokens=2
    )
    triton_paged.store_kv(key, value, kv_cache, metadata.slot_mapping)
    output = triton_paged.paged_decode(query, kv_cache, metadata, 0.25, num_segments=num_segments)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.25), torch.float32)
    assert torch.count_nonzero(output[len(seq_lens):]) == 0  # padding rows untouched


def test_split_decode_segments_depend_on_the_batch_shape_only():
    """A CUDA graph captured for a batch size must stay valid whatever the lengths: the segment count is a
    function of (requests, KV heads, device), at least 1 and at most MAX_DECODE_SEGMENTS."""
    cpu = torch.device("cpu")
    counts = [triton_paged.num_decode_segments(n, 2, cpu) for n in (1, 2, 3, 4, 64)]
    assert counts == sorted(counts, reverse=True) and counts[0] > 1 and counts[-1] == 1
    assert all(1 <= c <= triton_paged.MAX_DECODE_SEGMENTS for c in counts)
    query, _, _, kv_cache, metadata = make_batch([3], [1], block_size=4, num_kv_heads=1, group_size=1)
    with pytest.raises(ValueError, match="num_segments"):
        triton_paged.paged_decode(query, kv_cache, metadata, 1.0, _paged_decode_kernel=object(), num_segments=2)


@pytest.mark.parametrize("num_segments", [0, None, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_half_precision(dtype, num_segments):
    query, key, value, kv_cache, metadata = make_batch(
        [3, 16, 37], [1, 1, 1], block_size=4, num_kv_heads=2, group_size=2, head_size=32, dtype=dtype
    )
    triton_paged.store_kv(key, value, kv_cache, metadata.slot_mapping)
    output = triton_paged.paged_decode(query, kv_cache, metadata, 32**-0.5, num_segments=num_segments)
    assert output.dtype == dtype
    assert_close(output, oracle_attention(query, kv_cache, metadata, 32**-0.5), dtype)


def test_paged_attention_dispatches_decode_kernel_only_for_all_single_tokens(monkeypatch):
    calls = []
    for name in ("paged_decode", "paged_prefill"):
        original = getattr(triton_paged, name)
        monkeypatch.setattr(
            triton_paged, name, lambda *args, _name=name, _fn=original: calls.append(_name) or _fn(*args)
        )
    for query_lens in ([1, 1], [1, 2]):
        query, _, _, kv_cache, metadata = make_batch([5, 6], query_lens, block_size=4, num_kv_heads=1, group_size=2)
        triton_paged.paged_attention(query, kv_cache, metadata, 1.0)
    assert calls == ["paged_decode", "paged_prefill"]


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_prefill_from_empty_cache_float32(block_size, group_size):
    query_lens = [1, 5, block_size, 2 * block_size + 3]  # ragged, incl. one token and a block multiple
    query, key, value, kv_cache, metadata = make_batch(
        query_lens, query_lens, block_size=block_size, num_kv_heads=2, group_size=group_size
    )
    output = run_step(query, key, value, kv_cache, metadata, scale=0.25)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.25), torch.float32)
    assert_close(output, reference.paged_attention(query, kv_cache, metadata, 0.25), torch.float32)


@pytest.mark.parametrize("block_size", [4, 16])
def test_chunked_prefill_and_prefix_hits_mixed_with_decode(block_size):
    # context already cached (earlier chunk / prefix-cache hit) + new tokens; one plain decode row.
    seq_lens = [block_size + 3, 2 * block_size, 9, 75]
    query_lens = [3, block_size, 1, 17]
    query, key, value, kv_cache, metadata = make_batch(
        seq_lens, query_lens, block_size=block_size, num_kv_heads=2, group_size=2, seed=3
    )
    output = run_step(query, key, value, kv_cache, metadata, scale=0.3)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.3), torch.float32)
    assert_close(output, reference.paged_attention(query, kv_cache, metadata, 0.3), torch.float32)


def test_chunked_prefill_equals_one_shot_prefill():
    """Prefilling 11 tokens at once or as chunks of 4 + 7 gives the same outputs for the second chunk."""
    query, key, value, kv_cache, metadata = make_batch([11], [11], block_size=4, num_kv_heads=1, group_size=4)
    one_shot = run_step(query, key, value, kv_cache.clone(), metadata, scale=0.5)
    _, _, _, _, second_chunk = make_batch([11], [7], block_size=4, num_kv_heads=1, group_size=4)
    second_chunk.block_table = metadata.block_table  # same physical blocks
    second_chunk.slot_mapping = metadata.slot_mapping[4:]
    chunked_cache = kv_cache.clone()
    triton_paged.store_kv(key[:4], value[:4], chunked_cache, metadata.slot_mapping[:4])  # first chunk
    chunked = run_step(query[4:], key[4:], value[4:], chunked_cache, second_chunk, scale=0.5)
    assert_close(chunked, one_shot[4:], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_half_precision(dtype):
    query, key, value, kv_cache, metadata = make_batch(
        [6, 45], [6, 13], block_size=16, num_kv_heads=2, group_size=2, head_size=32, dtype=dtype
    )
    output = run_step(query, key, value, kv_cache, metadata, scale=32**-0.5)
    assert output.dtype == dtype
    assert_close(output, oracle_attention(query, kv_cache, metadata, 32**-0.5), dtype)


def test_padding_rows_are_zero_and_do_not_disturb_real_rows():
    query, key, value, kv_cache, metadata = make_batch(
        [7, 4], [7, 2], block_size=4, num_kv_heads=2, group_size=2, head_size=20, num_padding_tokens=3
    )
    output = run_step(query, key, value, kv_cache, metadata, scale=0.2)
    real = metadata.num_actual_tokens
    assert torch.count_nonzero(output[real:]) == 0
    assert_close(output[:real], oracle_attention(query[:real], kv_cache, metadata, 0.2), torch.float32)


@pytest.mark.parametrize("query_lens", [[1, 1], [4, 1]], ids=["decode", "prefill"])
def test_strided_query_from_a_fused_qkv_projection(query_lens):
    query, key, value, kv_cache, metadata = make_batch(
        [9, 6], query_lens, block_size=4, num_kv_heads=2, group_size=2
    )
    fused = torch.cat([query, key, value], dim=1)  # [T, Hq + 2 * Hkv, D], as a fused projection gives
    strided_query = fused[:, :4]
    assert not strided_query.is_contiguous()
    output = run_step(strided_query, fused[:, 4:6], fused[:, 6:], kv_cache, metadata, scale=0.25)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.25), torch.float32)


def test_head_size_not_power_of_two_and_seven_heads_per_kv_head():
    # Qwen2-0.5B style: 14 query heads over 2 KV heads, head size padded inside the kernel.
    query, key, value, kv_cache, metadata = make_batch(
        [5, 12], [5, 3], block_size=4, num_kv_heads=2, group_size=7, head_size=24
    )
    output = run_step(query, key, value, kv_cache, metadata, scale=0.2)
    assert_close(output, oracle_attention(query, kv_cache, metadata, 0.2), torch.float32)


@pytest.mark.parametrize("seed", range(4))
def test_random_mixed_batches_match_reference(seed):
    rng = random.Random(seed)
    block_size, group_size = rng.choice([4, 8, 16]), rng.choice([1, 2, 4])
    query_lens = [rng.choice([1, 1, 2, 5, 16]) for _ in range(rng.randint(1, 4))]
    seq_lens = [query_len + rng.randint(0, 30) for query_len in query_lens]  # cached context + new tokens
    query, key, value, kv_cache, metadata = make_batch(
        seq_lens, query_lens, block_size=block_size, num_kv_heads=rng.choice([1, 2]), group_size=group_size,
        head_size=rng.choice([16, 32]), seed=seed, num_padding_tokens=rng.randint(0, 2),
    )
    expected_cache = kv_cache.clone()
    reference.store_kv(key, value, expected_cache, metadata.slot_mapping)
    expected = reference.paged_attention(query, expected_cache, metadata, 0.2)
    output = run_step(query, key, value, kv_cache, metadata, scale=0.2)
    assert torch.equal(kv_cache, expected_cache)
    assert_close(output, expected, torch.float32)


# ---------------------------------------------------------------- bad input and platform


def test_bad_shapes_and_dtypes_raise_clear_errors():
    query, key, value, kv_cache, metadata = make_batch([4], [4], block_size=4, num_kv_heads=2, group_size=2)
    with pytest.raises(ValueError, match="kv_cache must have shape"):
        triton_paged.paged_attention(query, kv_cache[0], metadata, 1.0)
    with pytest.raises(ValueError, match="query must have shape"):
        triton_paged.paged_attention(query[:, :3], kv_cache, metadata, 1.0)
    with pytest.raises(TypeError, match="dtype"):
        triton_paged.paged_attention(query.half(), kv_cache, metadata, 1.0)
    with pytest.raises(ValueError, match="key must have shape"):
        triton_paged.store_kv(key[:, :1], value, kv_cache, metadata.slot_mapping)
    with pytest.raises(TypeError, match="slot_mapping"):
        triton_paged.store_kv(key, value, kv_cache, metadata.slot_mapping.float())


def test_unsupported_platform_raises_import_error_with_explanation(monkeypatch):
    monkeypatch.setattr(triton_utils.sys, "platform", "darwin")
    monkeypatch.setattr(triton_utils.platform, "machine", lambda: "arm64")
    assert not triton_utils.is_available()
    with pytest.raises(ImportError, match="Linux x86_64.*attention_backend='torch_fast'"):
        triton_utils.import_triton()


@pytest.mark.skipif(DEVICE == "cuda", reason="only the CPU interpreter has this import-order problem")
def test_kernels_run_when_triton_was_imported_before_the_interpreter_was_switched_on():
    # transformers imports triton early; Triton's own helpers (tl.zeros, tl.sum) are then compiled-mode.
    import subprocess
    import sys

    script = (
        "import os; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import triton, triton.language as tl, torch\n"
        "from mini.attention import triton_paged\n"
        "from mini.attention.reference import AttentionMetadata\n"
        "cache = torch.randn(2, 3, 4, 1, 16)\n"
        "meta = AttentionMetadata(1, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([6], dtype=torch.int32),\n"
        "    torch.tensor([[2, 1]], dtype=torch.int32), torch.tensor([5]), 1, 6)\n"
        "out = triton_paged.paged_attention(torch.randn(1, 2, 16), cache, meta, 0.25)\n"
        "print('ok', bool(torch.isfinite(out).all()))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=RUN_GUARD_S
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok True")
