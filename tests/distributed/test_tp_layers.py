"""Tensor-parallel layers (mini/model/parallel_linear.py, vocab_parallel_embedding.py, mini/distributed/).

Three levels:
  - one rank (no process group): each layer IS the plain layer, same outputs bit for bit, no collective;
  - the sharding itself, every rank of a size built in this process with explicit `tp_rank`/`tp_size` and no
    group (the collectives are then no-ops, so the test sums / concatenates the ranks' pieces by hand);
  - 2 real ranks over gloo in forked processes: each layer against the full `nn.Linear` / `nn.Embedding`,
    the collectives against their definitions.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
import uuid

import pytest
import torch
import torch.distributed as dist
from patience import HANG_GUARD_S
from torch import nn

from mini.distributed import communication_op, parallel_state
from mini.model.llama import DecoderConfig, check_tensor_parallel_size
from mini.model.parallel_linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    kv_head_partition,
)
from mini.model.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding, vocab_range
from mini.system_utils import release_libgomp_threads

IN, OUT, VOCAB = 12, 8, 11   # VOCAB not a multiple of 2 or 3: the last rank holds padding rows
ATOL = 1e-5


def full_linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    if bias:
        nn.init.normal_(layer.bias)
    return layer


def loaded(layer: nn.Module, full: nn.Module) -> nn.Module:
    """`layer` with its shard of `full`'s parameters, through its weight_loader (as mini/model/loader.py)."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            layer.weight_loader(param, getattr(full, name).detach())
    return layer


# ------------------------------------------------------------------------------------ one rank: plain layers
def test_one_rank_layers_compute_exactly_the_plain_layers_without_collectives(monkeypatch):
    def no_collective(*args, **kwargs):
        raise AssertionError("a collective ran at tensor_parallel_size=1")

    monkeypatch.setattr(dist, "all_reduce", no_collective)
    monkeypatch.setattr(dist, "all_gather", no_collective)
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    x = torch.randn(5, IN)
    full = full_linear(IN, OUT)
    for cls in (ColumnParallelLinear, RowParallelLinear):
        layer = loaded(cls(IN, OUT), full)
        assert isinstance(layer, nn.Linear) and layer.weight.shape == full.weight.shape
        assert torch.equal(layer(x), full(x)), cls.__name__
    torch.manual_seed(1)
    embedding = nn.Embedding(VOCAB, IN)
    ids = torch.tensor([0, 3, VOCAB - 1, 3])
    vocab_layer = loaded(VocabParallelEmbedding(VOCAB, IN), embedding)
    assert torch.equal(vocab_layer(ids), embedding(ids))
    head = loaded(ParallelLMHead(VOCAB, IN), embedding)
    assert torch.equal(head(x), x @ embedding.weight.T)


def test_weight_loader_refuses_a_tensor_of_the_wrong_shape():
    layer = ColumnParallelLinear(IN, OUT, tp_rank=0, tp_size=2)
    with pytest.raises(ValueError, match="shape"):
        layer.weight_loader(layer.weight, torch.zeros(OUT, IN + 1))
    with pytest.raises(ValueError, match="must be divisible by tensor parallel size"):
        ColumnParallelLinear(IN, 9, tp_rank=0, tp_size=2)


# ------------------------------------------------------------------------------------ the shards, by hand
@pytest.mark.parametrize("tp_size", [2, 4])
def test_column_and_row_shards_reassemble_the_full_layer(tp_size):
    x = torch.randn(3, IN)
    full = full_linear(IN, OUT)
    columns = [loaded(ColumnParallelLinear(IN, OUT, tp_rank=r, tp_size=tp_size), full) for r in range(tp_size)]
    assert columns[1].weight.shape == (OUT // tp_size, IN)
    torch.testing.assert_close(torch.cat([layer(x) for layer in columns], dim=-1), full(x), atol=ATOL, rtol=0)
    # Row-parallel: rank r multiplies ITS slice of the input; the all-reduce (here: a sum) adds the partials,
    # and only rank 0 adds the bias.
    rows = [loaded(RowParallelLinear(IN, OUT, tp_rank=r, tp_size=tp_size), full) for r in range(tp_size)]
    pieces = x.chunk(tp_size, dim=-1)
    partials = [layer(piece) for layer, piece in zip(rows, pieces, strict=True)]
    torch.testing.assert_close(torch.stack(partials).sum(0), full(x), atol=ATOL, rtol=0)
    assert all(torch.equal(layer.bias, full.bias) for layer in rows)


def test_merged_column_holds_each_rank_slice_of_gate_and_up():
    gate, up = full_linear(IN, OUT, seed=1), full_linear(IN, OUT, seed=2)
    x = torch.randn(4, IN)
    for rank in range(2):
        layer = MergedColumnParallelLinear(IN, [OUT, OUT], tp_rank=rank, tp_size=2)
        for shard_id, source in enumerate((gate, up)):
            layer.weight_loader(layer.weight, source.weight.detach(), shard_id)
            layer.weight_loader(layer.bias, source.bias.detach(), shard_id)
        gate_part, up_part = layer(x).split(layer.output_sizes_per_partition, dim=-1)
        half = slice(rank * OUT // 2, (rank + 1) * OUT // 2)
        torch.testing.assert_close(gate_part, gate(x)[:, half], atol=ATOL, rtol=0)
        torch.testing.assert_close(up_part, up(x)[:, half], atol=ATOL, rtol=0)


@pytest.mark.parametrize(("heads", "kv_heads", "tp_size"), [(4, 2, 2), (4, 2, 4), (6, 2, 2)])
def test_qkv_rank_holds_whole_heads_and_replicates_kv_heads_when_fewer_than_ranks(heads, kv_heads, tp_size):
    head_size = 3
    q = full_linear(IN, heads * head_size, seed=3)
    k = full_linear(IN, kv_heads * head_size, seed=4)
    v = full_linear(IN, kv_heads * head_size, seed=5)
    x = torch.randn(2, IN)
    group = heads // kv_heads
    for rank in range(tp_size):
        layer = QKVParallelLinear(IN, head_size, heads, kv_heads, tp_rank=rank, tp_size=tp_size)
        for shard_id, source in zip("qkv", (q, k, v), strict=True):
            layer.weight_loader(layer.weight, source.weight.detach(), shard_id)
            layer.weight_loader(layer.bias, source.bias.detach(), shard_id)
        q_out, k_out, v_out = layer(x).split(layer.split_sizes, dim=-1)
        my_heads = range(rank * layer.num_heads, (rank + 1) * layer.num_heads)
        my_kv_heads = sorted({h // group for h in my_heads})     # the KV heads this rank's queries attend to
        assert len(my_kv_heads) == layer.num_kv_heads

        def cols(heads_, size=head_size):
            return [h * size + i for h in heads_ for i in range(size)]

        torch.testing.assert_close(q_out, q(x)[:, cols(my_heads)], atol=ATOL, rtol=0)
        torch.testing.assert_close(k_out, k(x)[:, cols(my_kv_heads)], atol=ATOL, rtol=0)
        torch.testing.assert_close(v_out, v(x)[:, cols(my_kv_heads)], atol=ATOL, rtol=0)


def test_kv_head_partition_replicates_as_vllm():
    assert kv_head_partition(2, 4, 3) == kv_head_partition(2, 4, 2)   # ranks 2 and 3 share head 1
    assert kv_head_partition(2, 4, 3).shard_rank == 1 and kv_head_partition(2, 4, 3).replicas == 2
    assert kv_head_partition(3, 3, 2).num_kv_heads == 1 and kv_head_partition(3, 3, 2).replicas == 1
    with pytest.raises(ValueError, match=r"\(3\) must be divisible by tensor parallel size \(2\)"):
        kv_head_partition(3, 2, 0)


@pytest.mark.parametrize("tp_size", [2, 3])
def test_vocab_shards_mask_and_pad(tp_size):
    torch.manual_seed(0)
    embedding = nn.Embedding(VOCAB, IN)
    ids = torch.arange(VOCAB).flip(0)
    layers = [loaded(VocabParallelEmbedding(VOCAB, IN, tp_rank=r, tp_size=tp_size), embedding)
              for r in range(tp_size)]
    assert [vocab_range(VOCAB, r, tp_size) for r in range(tp_size)][-1][1] == VOCAB
    # No group here: each rank's forward is its masked partial lookup; the all-reduce is the sum.
    torch.testing.assert_close(torch.stack([layer(ids) for layer in layers]).sum(0), embedding(ids),
                               atol=0, rtol=0)
    assert torch.count_nonzero(layers[-1].weight[VOCAB - layers[-1].vocab_start_index:]) == 0   # padding rows
    heads = [loaded(ParallelLMHead(VOCAB, IN, tp_rank=r, tp_size=tp_size), embedding) for r in range(tp_size)]
    x = torch.randn(3, IN)
    # No group: each forward is the local slice; the all-gather is the concatenation, padding cut.
    logits = torch.cat([head(x) for head in heads], dim=-1)[:, :VOCAB]
    torch.testing.assert_close(logits, x @ embedding.weight.T, atol=ATOL, rtol=0)


def test_head_counts_the_size_does_not_divide_are_refused_with_the_counts():
    def config(heads, kv_heads):
        return DecoderConfig.from_hf_config({"model_type": "llama", "vocab_size": 8, "hidden_size": 36,
                                             "intermediate_size": 8, "num_hidden_layers": 1,
                                             "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                             "rms_norm_eps": 1e-6, "rope_theta": 10000.0})

    with pytest.raises(ValueError, match=r"attention heads \(9\) must be divisible by tensor parallel size \(2\)"):
        check_tensor_parallel_size(config(9, 3), 2)
    with pytest.raises(ValueError, match=r"KV heads \(2\) .* tensor parallel size \(3\)"):
        check_tensor_parallel_size(config(6, 2), 3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive int"):
        check_tensor_parallel_size(config(6, 2), 0)
    check_tensor_parallel_size(config(6, 2), 6)    # 2 KV heads, each replicated on 3 ranks
    check_tensor_parallel_size(config(9, 3), 3)


# ------------------------------------------------------------------------------------ 2 real ranks (gloo)
def _two_rank_checks(rank: int, init_method: str, results) -> None:
    """Rank `rank` of 2: every layer against the full one (same seed on both ranks -> same full weights)."""
    try:
        torch.set_num_threads(1)
        parallel_state.init_distributed_environment(2, rank, init_method, "cpu")
        assert parallel_state.get_tensor_model_parallel_rank() == rank
        assert parallel_state.get_tensor_model_parallel_world_size() == 2
        # The collectives against their definitions.
        mine = torch.full((2, 3), float(rank + 1))
        assert torch.equal(communication_op.tensor_model_parallel_all_reduce(mine.clone()), torch.full((2, 3), 3.0))
        gathered = communication_op.tensor_model_parallel_all_gather(mine, dim=-1)
        assert torch.equal(gathered, torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)], dim=-1))
        to_zero = communication_op.tensor_model_parallel_gather(mine, dst=0, dim=0)
        assert (to_zero is None) == (rank == 1)
        if rank == 0:
            assert torch.equal(to_zero, torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]))
        # The layers, built from this process's group (no explicit rank / size).
        torch.manual_seed(0)
        x = torch.randn(4, IN)
        full = full_linear(IN, OUT)
        column = loaded(ColumnParallelLinear(IN, OUT, gather_output=True), full)
        torch.testing.assert_close(column(x), full(x), atol=ATOL, rtol=0)
        row = loaded(RowParallelLinear(IN, OUT), full)
        torch.testing.assert_close(row(x.chunk(2, dim=-1)[rank]), full(x), atol=ATOL, rtol=0)
        # A column -> row pair (an MLP without its activation): one all-reduce, the full result on both ranks.
        up, down = full_linear(IN, OUT, seed=1), full_linear(OUT, IN, seed=2)
        pair = nn.Sequential(loaded(ColumnParallelLinear(IN, OUT), up), loaded(RowParallelLinear(OUT, IN), down))
        torch.testing.assert_close(pair(x), down(up(x)), atol=ATOL, rtol=0)
        embedding = nn.Embedding(VOCAB, IN)
        ids = torch.tensor([0, 5, 6, VOCAB - 1, 2])
        torch.testing.assert_close(loaded(VocabParallelEmbedding(VOCAB, IN), embedding)(ids), embedding(ids),
                                   atol=0, rtol=0)
        head = loaded(ParallelLMHead(VOCAB, IN), embedding)
        torch.testing.assert_close(head(x), x @ embedding.weight.T, atol=ATOL, rtol=0)
        results.put((rank, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((rank, traceback.format_exc()))
    finally:
        parallel_state.destroy_distributed_environment()


def test_layers_on_two_gloo_ranks_match_the_full_layers():
    context = multiprocessing.get_context("fork")
    init_file = os.path.join(tempfile.gettempdir(), f"mini_tp_test_{uuid.uuid4().hex}")
    results = context.Queue()
    release_libgomp_threads()
    ranks = [context.Process(target=_two_rank_checks, args=(rank, f"file://{init_file}", results), daemon=True)
             for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        outcomes = dict(results.get(timeout=HANG_GUARD_S) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=HANG_GUARD_S)
            if process.is_alive():
                process.kill()
                process.join()
        if os.path.exists(init_file):
            os.remove(init_file)
    assert outcomes == {0: "ok", 1: "ok"}, "\n".join(str(value) for value in outcomes.values())
    assert [process.exitcode for process in ranks] == [0, 0]
