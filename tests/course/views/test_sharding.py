"""The sharding diagram (labs/views/sharding.py): every rank's slice of one Llama layer's weights, from the
config alone, and the same shapes as the parallel layers mini builds for that rank."""

from __future__ import annotations

import sys

import pytest
import torch

from labs.views.sharding import render_sharding_html, render_sharding_text, sharding_table, sharding_widget
from labs.views.text_view import TEXT_VIEW_PREFIX, TextView
from mini.model.parallel_linear import ColumnParallelLinear, RowParallelLinear, kv_head_partition
from mini.model.vocab_parallel_embedding import VocabParallelEmbedding

SHIPPED = {"hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 32,
           "intermediate_size": 512, "vocab_size": 4096}
SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "intermediate_size": 1536, "vocab_size": 49152}


def by_name(shards, rank):
    return {s.weight: s for s in shards if s.rank == rank}


def test_the_shipped_model_at_tp2():
    shards = sharding_table(SHIPPED, 2)
    rank1 = by_name(shards, 1)
    assert rank1["q_proj"].shape == (96, 192) and (rank1["q_proj"].start, rank1["q_proj"].end) == (96, 192)
    assert rank1["k_proj"].shape == (32, 192) and (rank1["k_proj"].start, rank1["k_proj"].end) == (32, 64)
    assert rank1["o_proj"].cut == "columns" and rank1["o_proj"].shape == (192, 96)
    assert rank1["down_proj"].after == rank1["o_proj"].after == "all-reduce"
    assert rank1["embed_tokens"].after == "masked all-reduce" and rank1["lm_head"].after == "all-gather"
    assert (rank1["lm_head"].start, rank1["lm_head"].end) == (2048, 4096)


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    config = dict(SHIPPED, num_key_value_heads=1)
    shards = sharding_table(config, 2)
    assert [(s.start, s.end) for s in shards if s.weight == "v_proj"] == [(0, 32), (0, 32)]


def test_smollm2_at_tp3_and_refused_sizes():
    rank2 = by_name(sharding_table(SMOLLM2, 3), 2)
    assert rank2["q_proj"].shape == (192, 576) and (rank2["k_proj"].start, rank2["k_proj"].end) == (128, 192)
    with pytest.raises(ValueError, match="attention heads"):
        sharding_table(SMOLLM2, 2)


@pytest.mark.parametrize(("config", "tp"), [(SHIPPED, 2), (dict(SHIPPED, num_key_value_heads=1), 2), (SMOLLM2, 3)])
def test_the_shapes_are_the_layers_mini_builds(config, tp):
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    for rank in range(tp):
        shards = by_name(sharding_table(config, tp), rank)
        kv = kv_head_partition(config["num_key_value_heads"], tp, rank)
        with torch.device("meta"):
            q = ColumnParallelLinear(hidden, config["num_attention_heads"] * head_dim, tp_rank=rank, tp_size=tp)
            k = ColumnParallelLinear(hidden, config["num_key_value_heads"] * head_dim, tp_rank=kv.shard_rank,
                                     tp_size=kv.num_shards)
            o = RowParallelLinear(config["num_attention_heads"] * head_dim, hidden, tp_rank=rank, tp_size=tp)
            down = RowParallelLinear(config["intermediate_size"], hidden, tp_rank=rank, tp_size=tp)
            embed = VocabParallelEmbedding(config["vocab_size"], hidden, tp_rank=rank, tp_size=tp)
        assert tuple(q.weight.shape) == shards["q_proj"].shape and tuple(k.weight.shape) == shards["k_proj"].shape
        assert tuple(o.weight.shape) == shards["o_proj"].shape
        assert tuple(down.weight.shape) == shards["down_proj"].shape
        assert tuple(embed.weight.shape) == shards["embed_tokens"].shape
        assert (embed.vocab_start_index, embed.vocab_end_index) == (shards["embed_tokens"].start,
                                                                   shards["embed_tokens"].end)


def test_the_widget_its_text_and_the_fallback(monkeypatch):
    text = render_sharding_text(sharding_table(SHIPPED, 2))
    assert text.startswith(TEXT_VIEW_PREFIX + "the sharding diagram (tensor_parallel_size=2)")
    assert "o_proj        full [192, 192], cut by columns, then all-reduce" in text
    assert "    rank 1: [32, 192]  rows [32, 64)" in text
    assert render_sharding_html(sharding_table(SHIPPED, 2)).count("<tr>") == 9
    widget = sharding_widget(SHIPPED, 2)
    assert widget.text() == text and widget._repr_mimebundle_()["text/plain"] == text
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    view = sharding_widget(SHIPPED, 2)
    assert isinstance(view, TextView) and repr(view) == text
