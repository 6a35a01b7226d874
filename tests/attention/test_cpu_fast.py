"""mini/attention/cpu_paged.py ("torch_fast", the CPU default) equals the phase 03 reference on paged batches.

Batches are random and shaped like engine steps: decode rows, speculative verification rows of 1 + k
tokens over long contexts, fresh prompts and prefill chunks over cached context, mixed in one flat batch,
with GQA and block sizes 1 / 4 / 16; blocks are handed out shuffled so every block table is scattered.
float32 agrees with the reference to 1e-5; bfloat16 (SDPA in bf16 with float32 accumulation, against the
reference's float32 math on the same bf16 inputs) to 2e-2. Timings are benchmarks, never asserted here.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini.attention import attention_backend_class, build_attention_backend, cpu_paged
from mini.attention import reference as ref
from mini.config import EngineConfig
from mini.utils import cdiv

ROW_KINDS = ("decode", "verify", "prefill", "chunk")


def build_batch(rows: list[tuple[int, int]], num_kv_heads: int, group_size: int, head_size: int, block_size: int,
                dtype: torch.dtype = torch.float32, seed: int = 0, padding_rows: int = 0):
    """rows: (query_len, seq_len) per request. A cache with scattered blocks, the metadata, a query."""
    generator = torch.Generator().manual_seed(seed)
    block_counts = [cdiv(seq_len, block_size) for _, seq_len in rows]
    num_blocks = sum(block_counts) + 1 + 3  # null block 0 and a few blocks nobody owns
    free = list(range(1, num_blocks))
    random.Random(seed).shuffle(free)
    block_table = torch.zeros(len(rows), max(block_counts) + 2, dtype=torch.int32)  # 0-padded, wider than needed
    for row, count in enumerate(block_counts):
        block_table[row, :count] = torch.tensor(free[:count])
        free = free[count:]
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=generator).to(dtype)
    query_lens = [query_len for query_len, _ in rows]
    num_tokens = sum(query_lens)
    query_start_loc = torch.tensor([0] + [sum(query_lens[: i + 1]) for i in range(len(rows))], dtype=torch.int32)
    metadata = ref.AttentionMetadata(
        num_actual_tokens=num_tokens,
        query_start_loc=query_start_loc,
        seq_lens=torch.tensor([seq_len for _, seq_len in rows], dtype=torch.int32),
        block_table=block_table,
        slot_mapping=torch.full((num_tokens + padding_rows,), -1, dtype=torch.int64),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_len for _, seq_len in rows),
    )
    query = torch.randn(num_tokens + padding_rows, num_kv_heads * group_size, head_size, generator=generator)
    return query.to(dtype), kv_cache, metadata


def random_rows(rng: random.Random, num_rows: int, max_context: int = 90) -> list[tuple[int, int]]:
    rows = []
    for _ in range(num_rows):
        seq_len = rng.randint(1, max_context)
        kind = rng.choice(ROW_KINDS)
        query_len = {"decode": 1, "verify": min(seq_len, rng.randint(2, 5)), "prefill": seq_len,
                     "chunk": rng.randint(1, seq_len)}[kind]
        rows.append((query_len, seq_len))
    return rows


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", range(8))
def test_fast_path_equals_reference_on_random_mixed_batches(seed, block_size):
    rng = random.Random(seed * 100 + block_size)
    rows = random_rows(rng, rng.randint(1, 12))
    query, kv_cache, metadata = build_batch(rows, num_kv_heads=rng.choice([1, 2, 3]),
                                            group_size=rng.choice([1, 2, 3, 4]), head_size=rng.choice([8, 16, 32]),
                                            block_size=block_size, seed=seed)
    expected = ref.paged_attention(query, kv_cache, metadata, 0.3)
    got = cpu_paged.paged_attention(query, kv_cache, metadata, 0.3)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


SHAPES = {
    "decode-only, ragged": [(1, n) for n in (1, 7, 16, 17, 40, 95, 3, 64)],
    "decode-only, uniform": [(1, 33)] * 6,
    "verification rows 1+k over long contexts": [(5, 300), (5, 420), (3, 299), (2, 64), (1, 500), (5, 5)],
    "prompts and chunks only": [(40, 40), (17, 90), (33, 33)],
    "everything at once": [(64, 64), (1, 200), (4, 250), (20, 120), (1, 1), (5, 37)],
}


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fast_path_equals_reference_on_engine_shaped_batches(shape, group_size):
    query, kv_cache, metadata = build_batch(SHAPES[shape], num_kv_heads=2, group_size=group_size, head_size=16,
                                            block_size=16)
    torch.testing.assert_close(cpu_paged.paged_attention(query, kv_cache, metadata, 0.25),
                               ref.paged_attention(query, kv_cache, metadata, 0.25), atol=1e-5, rtol=1e-5)


def test_groups_cut_by_query_length_and_power_of_two_length_class():
    """Rows are grouped by query length, then by context length within 2x; the shortest share a class."""
    rows = [(1, 10), (1, 1000), (1, 12), (1, 600), (1, 499), (1, 260), (1, 130), (5, 500), (5, 510), (40, 40)]
    query, _, metadata = build_batch(rows, num_kv_heads=1, group_size=2, head_size=8, block_size=4)
    plan = cpu_paged.plan_step(metadata, 4, 2, query.shape[0], max_group_tokens=10_000)
    groups = sorted((g.query_len, g.context_len, g.num_requests) for g in plan.short_groups)
    # longest 1000: classes (500, 1000] | (250, 500] | (125, 250] | everything shorter, per query length
    assert groups == [(1, 12, 2), (1, 130, 1), (1, 499, 2), (1, 1000, 2), (5, 500, 1), (5, 510, 1)]
    assert sorted(plan.short_rows.tolist()) == list(range(17))  # every short row once; the prompt's are long
    assert [(r.start, r.end, r.seq_len, r.mask is None) for r in plan.long_requests] == [(17, 57, 40, True)]
    assert plan.covers_all_rows


def test_a_group_stays_under_the_gather_budget(monkeypatch):
    rows = [(1, 100)] * 10
    query, kv_cache, metadata = build_batch(rows, num_kv_heads=1, group_size=1, head_size=8, block_size=4)
    plan = cpu_paged.plan_step(metadata, 4, 1, query.shape[0], max_group_tokens=350)  # 3 contexts of 100
    assert [g.num_requests for g in plan.short_groups] == [3, 3, 3, 1]
    assert [g.rows for g in plan.short_groups] == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    # In the engine: GROUP_KV_BYTES_PER_THREAD for each torch thread, counted in bytes of K + V.
    kv_bytes_per_token = 2 * 8 * kv_cache.element_size()
    monkeypatch.setattr(cpu_paged, "GROUP_KV_BYTES_PER_THREAD", 250 * kv_bytes_per_token)
    threads = torch.get_num_threads()
    try:
        for num_threads, sizes in ((1, [2, 2, 2, 2, 2]), (2, [5, 5])):
            torch.set_num_threads(num_threads)
            plan = cpu_paged.get_plan(metadata, kv_cache, query)
            assert [g.num_requests for g in plan.short_groups] == sizes
    finally:
        torch.set_num_threads(threads)


def test_bfloat16_within_stated_tolerance():
    rows = random_rows(random.Random(7), 10, max_context=200)
    query, kv_cache, metadata = build_batch(rows, num_kv_heads=2, group_size=3, head_size=32, block_size=16,
                                            dtype=torch.bfloat16)
    expected = ref.paged_attention(query, kv_cache, metadata, 32**-0.5)  # float32 math on bf16 inputs
    got = cpu_paged.paged_attention(query, kv_cache, metadata, 32**-0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_rows_past_the_batch_stay_zero_as_in_the_reference():
    query, kv_cache, metadata = build_batch([(1, 20), (6, 6)], num_kv_heads=2, group_size=2, head_size=8,
                                            block_size=4, padding_rows=3)
    got = cpu_paged.paged_attention(query, kv_cache, metadata, 0.5)
    assert torch.equal(got[-3:], torch.zeros_like(got[-3:]))
    torch.testing.assert_close(got, ref.paged_attention(query, kv_cache, metadata, 0.5), atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.sampled_from(ROW_KINDS), st.integers(1, 70), st.integers(0, 10_000)),
                  min_size=1, max_size=10),
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_kv_heads=st.integers(1, 3),
    group_size=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_fast_path_equals_reference_hypothesis(rows, block_size, num_kv_heads, group_size, seed):
    shaped = []
    for kind, seq_len, pick in rows:
        query_len = {"decode": 1, "verify": min(seq_len, 2 + pick % 4), "prefill": seq_len,
                     "chunk": 1 + pick % seq_len}[kind]
        shaped.append((query_len, seq_len))
    query, kv_cache, metadata = build_batch(shaped, num_kv_heads, group_size, 8, block_size, seed=seed)
    torch.testing.assert_close(cpu_paged.paged_attention(query, kv_cache, metadata, 0.35),
                               ref.paged_attention(query, kv_cache, metadata, 0.35), atol=1e-5, rtol=1e-5)


def test_store_kv_equals_reference_and_skips_padding():
    generator = torch.Generator().manual_seed(0)
    key, value = torch.randn(2, 7, 2, 4, generator=generator).unbind(0)
    slots = torch.tensor([5, -1, 14, 0, 31, -1, 9])
    expected, got = torch.zeros(2, 8, 4, 2, 4), torch.zeros(2, 8, 4, 2, 4)
    ref.store_kv(key, value, expected, slots)
    cpu_paged.store_kv(key, value, got, slots)
    assert torch.equal(got, expected)
    cpu_paged.store_kv(key[:3], value[:3], got, torch.tensor([1, 2, 3]))  # no padding at all
    ref.store_kv(key[:3], value[:3], expected, torch.tensor([1, 2, 3]))
    assert torch.equal(got, expected)


def test_the_plan_is_built_once_per_step_and_rebuilt_for_the_next():
    query, kv_cache, metadata = build_batch([(1, 20), (3, 30)], num_kv_heads=1, group_size=2, head_size=8,
                                            block_size=4)
    first = cpu_paged.get_plan(metadata, kv_cache, query)
    assert cpu_paged.get_plan(metadata, kv_cache, query) is first  # the other layers of the step
    next_step = ref.AttentionMetadata(**{name: getattr(metadata, name) for name in ref.AttentionMetadata.__slots__})
    assert cpu_paged.get_plan(next_step, kv_cache, query) is not first


def test_an_engine_replacing_a_reference_part_builds_the_reference_backend():
    """A config that replaces one of phase 03's functions (labs `plug`) make "torch_fast" build the reference
    backend holding them, decided once when the engine is built; a gather_kv reaches the prefill loop."""
    query, kv_cache, metadata = build_batch([(1, 9), (4, 4)], num_kv_heads=1, group_size=2, head_size=8,
                                            block_size=4)
    calls = []

    def my_paged_attention(q, cache, md, scale):
        calls.append("paged_attention")
        return torch.full_like(q, 7.0)

    def my_store_kv(key, value, cache, slot_mapping):
        calls.append("store_kv")

    def my_gather_kv(cache_side, block_ids, seq_len):
        calls.append("gather_kv")
        return ref.gather_kv(cache_side, block_ids, seq_len)

    assert attention_backend_class("torch_fast") is cpu_paged.CpuAttentionBackend
    config = EngineConfig(parts={"paged_attention": my_paged_attention, "store_kv": my_store_kv})
    backend = build_attention_backend("torch_fast", config)
    assert type(backend).__bases__ == (ref.ReferenceAttentionBackend,)
    assert type(backend) is attention_backend_class("torch", config)   # the same class, built once
    backend.store_kv(query[:, :1], query[:, :1], kv_cache, torch.tensor([1, 2, 3, 4, 5]))
    assert torch.equal(backend.paged_attention(query, kv_cache, metadata, 1.0), torch.full_like(query, 7.0))
    backend = build_attention_backend("torch_fast", EngineConfig(parts={"gather_kv": my_gather_kv}))
    torch.testing.assert_close(backend.paged_attention(query, kv_cache, metadata, 1.0),  # the reference's own
                               ref.paged_attention(query, kv_cache, metadata, 1.0))
    assert calls[:2] == ["store_kv", "paged_attention"] and set(calls[2:]) == {"gather_kv"}
    # the fast backend itself holds no replacement: an engine built without parts runs it
    assert type(build_attention_backend("torch_fast")) is cpu_paged.CpuAttentionBackend


def test_backend_names_and_cpu_default():
    assert type(build_attention_backend("torch_fast")) is cpu_paged.CpuAttentionBackend
    assert type(build_attention_backend("torch")) is ref.ReferenceAttentionBackend  # phase 03's functions
    assert ref.ReferenceAttentionBackend.paged_attention is ref.paged_attention
    assert EngineConfig().resolved_attention_backend() == "torch_fast"  # the CPU default
    assert EngineConfig(attention_backend="torch").resolved_attention_backend() == "torch"


def test_engine_greedy_tokens_equal_with_both_cpu_backends(tiny_llama_dir):
    from mini import LLM, SamplingParams

    generator = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(0, 211, (n,), generator=generator).tolist()}
               for n in (1, 5, 13, 22, 40)]
    tokens = {}
    for backend in ("torch", "torch_fast"):
        llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, attention_backend=backend, block_size=4,
                  max_num_batched_tokens=24)
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        tokens[backend] = [list(output.outputs[0].token_ids) for output in outputs]
    assert tokens["torch_fast"] == tokens["torch"]
    assert all(len(t) == 12 for t in tokens["torch"])


def test_attention_benchmark_runs_on_cpu_and_agrees(capsys):
    from mini.bench import attention

    results = attention.main(["--kernel", "cpu", "--rounds", "1", "--mixes", "decode-ragged,verify-1+4,prefill",
                              "--num-heads", "4", "--num-kv-heads", "2", "--head-size", "16"])
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"paged_over_contiguous=\d+\.\d\d speedup_vs_reference=\d+\.\d\d", last_line)
    assert max(value for key, value in results.items() if key.startswith("max_error@")) < 1e-4
    with pytest.raises(ValueError, match="--mixes"):
        attention.main(["--kernel", "cpu", "--mixes", "nope"])
