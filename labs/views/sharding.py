"""Mirrors vllm/model_executor/layers/linear.py and vocab_parallel_embedding.py: which slice of each weight of
one Llama layer every tensor-parallel rank holds, and which collective follows it.

`sharding_table(hf_config, tp_size)` computes, from the model's config only (no weights, no processes), for
each rank and each weight (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`,
`embed_tokens`, `lm_head`): the full checkpoint shape, the shard's shape, the dimension that is cut (rows =
output features, columns = input features) with the range this rank holds, and the collective after the
layer (o_proj's and down_proj's all-reduce, the embedding's masked all-reduce, the LM head's all-gather).
The ranges are mini's own (mini/model/parallel_linear.py `kv_head_partition`, vocab_parallel_embedding.py
`vocab_range`), so KV heads replicated over ranks show as equal ranges on several ranks.
`sharding_widget(hf_config, tp_size)` draws each weight as a bar with every rank's slice coloured;
`render_sharding_text` is its text twin.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from labs.views.colors import REQUEST_COLORS
from labs.views.text_view import TextView, have_widgets, header, view_box
from mini.model.parallel_linear import kv_head_partition
from mini.model.vocab_parallel_embedding import vocab_range


@dataclass(frozen=True, slots=True)
class Shard:
    """One rank's slice of one weight."""

    weight: str
    rank: int
    full_shape: tuple[int, int]     # [out, in] as in the checkpoint ([vocab, hidden] for the vocabulary ones)
    shape: tuple[int, int]          # this rank's parameter
    cut: str                        # "rows" (output features / vocabulary) or "columns" (input features)
    start: int                      # this rank's range along the cut dimension, [start, end)
    end: int
    after: str                      # the collective that follows the layer ("" for none)


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default) if not isinstance(config, dict) else config.get(name, default)


def sharding_table(hf_config: Any, tp_size: int) -> list[Shard]:
    """Every rank's shard of one decoder layer's weights, the embedding and the LM head."""
    hidden = int(_get(hf_config, "hidden_size"))
    heads = int(_get(hf_config, "num_attention_heads"))
    kv_heads = int(_get(hf_config, "num_key_value_heads") or heads)
    head_dim = int(_get(hf_config, "head_dim") or hidden // heads)
    inner = int(_get(hf_config, "intermediate_size"))
    vocab = int(_get(hf_config, "vocab_size"))
    if tp_size < 1 or heads % tp_size or inner % tp_size:
        raise ValueError(f"tp_size must divide the attention heads ({heads}) and the MLP size ({inner}); "
                         f"got tp_size={tp_size}")
    q_rows = heads // tp_size * head_dim
    i_rows = inner // tp_size
    shards = []
    for rank in range(tp_size):
        kv = kv_head_partition(kv_heads, tp_size, rank)
        kv_rows = kv.num_kv_heads * head_dim
        v_start, v_end = vocab_range(vocab, rank, tp_size)
        per_rank_vocab = -(-vocab // tp_size)
        shards += [
            Shard("q_proj", rank, (heads * head_dim, hidden), (q_rows, hidden), "rows", rank * q_rows,
                  (rank + 1) * q_rows, ""),
            Shard("k_proj", rank, (kv_heads * head_dim, hidden), (kv_rows, hidden), "rows",
                  kv.shard_rank * kv_rows, (kv.shard_rank + 1) * kv_rows, ""),
            Shard("v_proj", rank, (kv_heads * head_dim, hidden), (kv_rows, hidden), "rows",
                  kv.shard_rank * kv_rows, (kv.shard_rank + 1) * kv_rows, ""),
            Shard("o_proj", rank, (hidden, heads * head_dim), (hidden, q_rows), "columns", rank * q_rows,
                  (rank + 1) * q_rows, "all-reduce"),
            Shard("gate_proj", rank, (inner, hidden), (i_rows, hidden), "rows", rank * i_rows, (rank + 1) * i_rows,
                  ""),
            Shard("up_proj", rank, (inner, hidden), (i_rows, hidden), "rows", rank * i_rows, (rank + 1) * i_rows,
                  ""),
            Shard("down_proj", rank, (hidden, inner), (hidden, i_rows), "columns", rank * i_rows,
                  (rank + 1) * i_rows, "all-reduce"),
            Shard("embed_tokens", rank, (vocab, hidden), (per_rank_vocab, hidden), "rows", v_start, v_end,
                  "masked all-reduce"),
            Shard("lm_head", rank, (vocab, hidden), (per_rank_vocab, hidden), "rows", v_start, v_end,
                  "all-gather"),
        ]
    return shards


def _weights(shards: list[Shard]) -> list[str]:
    return list(dict.fromkeys(shard.weight for shard in shards))


def render_sharding_text(shards: list[Shard], title: str = "") -> str:
    """The table as text: per weight, each rank's shape and range."""
    tp_size = max(shard.rank for shard in shards) + 1
    lines = [header("the sharding diagram", title or f"tensor_parallel_size={tp_size}")]
    for weight in _weights(shards):
        rows = [s for s in shards if s.weight == weight]
        first = rows[0]
        lines.append(f"{weight:<13} full {list(first.full_shape)}, cut by {first.cut}"
                     + (f", then {first.after}" if first.after else ""))
        for shard in rows:
            lines.append(f"    rank {shard.rank}: {list(shard.shape)}  {shard.cut} [{shard.start}, {shard.end})")
    return "\n".join(lines)


def render_sharding_html(shards: list[Shard]) -> str:
    """Each weight as a bar along its cut dimension, every rank's slice in its colour."""
    tp_size = max(shard.rank for shard in shards) + 1
    colors = [REQUEST_COLORS[rank % len(REQUEST_COLORS)] for rank in range(tp_size)]
    parts = ["<table style='border-collapse:collapse'>"]
    for weight in _weights(shards):
        rows = [s for s in shards if s.weight == weight]
        first = rows[0]
        length = first.full_shape[0] if first.cut == "rows" else first.full_shape[1]
        bars = []
        for shard in rows:
            left = 100.0 * shard.start / length
            width = max(100.0 * (shard.end - shard.start) / length, 0.5)
            bars.append(f"<div title='rank {shard.rank}: {shard.cut} [{shard.start}, {shard.end})' "
                        f"style='position:relative;height:10px;margin:1px 0'><div style='position:absolute;"
                        f"left:{left:.2f}%;width:{width:.2f}%;height:10px;background:{colors[shard.rank]}'>"
                        f"</div></div>")
        ranks = "<br>".join(f"rank {s.rank}: {list(s.shape)} [{s.start}, {s.end})" for s in rows)
        parts.append(f"<tr><td style='padding:2px 8px;font-family:monospace'>{html.escape(weight)}<br>"
                     f"<small>{list(first.full_shape)}, {first.cut}</small></td>"
                     f"<td style='width:260px;padding:2px 8px'>{''.join(bars)}</td>"
                     f"<td style='padding:2px 8px;font-size:small'>{ranks}</td>"
                     f"<td style='padding:2px 8px'><b>{html.escape(first.after)}</b></td></tr>")
    parts.append("</table>")
    return "".join(parts)


def sharding_widget(hf_config: Any, tp_size: int, title: str = "") -> Any:
    """The sharding diagram of `hf_config`'s layer at `tp_size` (a `ViewBox`, or its `TextView`)."""
    shards = sharding_table(hf_config, tp_size)

    def render(step: Any = None) -> str:
        return render_sharding_text(shards, title)

    if not have_widgets():
        return TextView(render)
    import ipywidgets as widgets

    return view_box([widgets.HTML(render_sharding_html(shards))], render)


__all__ = ["Shard", "render_sharding_html", "render_sharding_text", "sharding_table", "sharding_widget"]
