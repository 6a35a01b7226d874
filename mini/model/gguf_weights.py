"""Read a GGUF file's tensors under mini's (Hugging Face) names, quantized blocks kept as stored bytes.

Mirrors `gguf_quant_weights_iterator` of vllm/model_executor/model_loader/weight_utils.py in older vLLM releases
(v0.33.0 has no GGUF loader; see mini/model/gguf_loader.py): every tensor of the file, a quantized one as its raw
block bytes (`<layer>.qweight`, uint8 `[out_features, row_bytes]`) with its type, a float one as floats. Used by
`quantization="gguf"` (mini/model/quantization/gguf.py); the default GGUF path converts to float instead.

- Names: llama.cpp's (`blk.3.attn_q.weight`) -> mini's (`model.layers.3.self_attn.q_proj.weight`), for the Llama,
  Qwen2 and Qwen3 tensor sets (`hf_name`).
- Shapes: GGUF lists dimensions innermost first; a matrix `[in, out]` there is `[out, in]` here.
- llama.cpp's converter permutes the rows of a Llama's q and k projections (rotary pairs interleaved); they are
  permuted back as transformers does (`LlamaTensorProcessor`). The permutation moves whole rows, and a block never
  crosses a row, so it applies to the raw block bytes unchanged: the values stay exactly as stored.
- The embedding is read as float rows (dequantized by the `gguf` package): lookups need rows, not a matmul. A tied
  LM head gets the embedding's blocks as its `qweight`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FLOAT_TYPES = ("F32", "F16", "BF16")   # served unquantized, as floats
EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
SKIPPED_TENSORS = ("rope_freqs.weight",)   # llama.cpp's precomputed rotary factors: mini recomputes them
_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IN_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """One tensor of the file, under mini's name: its llama.cpp type and its shape (`[out, in]` for a matrix)."""

    gguf_name: str
    type_name: str
    shape: tuple[int, ...]


def hf_name(gguf_name: str) -> str:
    """llama.cpp's tensor name -> mini's; ValueError for a tensor mini's decoder has no place for."""
    top, _, suffix = gguf_name.rpartition(".")
    if top in _TOP_LEVEL and suffix in ("weight", "bias"):
        return f"{_TOP_LEVEL[top]}.{suffix}"
    match = _LAYER_NAME.match(gguf_name)
    if match and match.group(2) in _IN_LAYER:
        return f"model.layers.{match.group(1)}.{_IN_LAYER[match.group(2)]}.{match.group(3)}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in mini's decoder (Llama / Qwen2 / Qwen3 tensors only)")


def open_gguf(path: str | Path) -> Any:
    """A `gguf.GGUFReader` (metadata parsed, tensor data memory-mapped: nothing is read yet)."""
    from gguf import GGUFReader

    return GGUFReader(Path(path))


def tensor_infos(reader: Any) -> dict[str, GGUFTensorInfo]:
    """mini's name -> type and shape, for every tensor of the file (no data read)."""
    infos = {}
    for tensor in reader.tensors:
        if tensor.name in SKIPPED_TENSORS:
            continue
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        infos[hf_name(tensor.name)] = GGUFTensorInfo(tensor.name, tensor.tensor_type.name, shape)
    return infos


def architecture(reader: Any) -> str:
    return str(reader.fields["general.architecture"].contents())


def unpermute_rows(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (transformers' `_reverse_permute_weights`), on any per-row data."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def iterate_gguf(reader: Any, hf_config: Any, quantized_names: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for the checkpoint loader (mini/model/loader.py `load_weights`).

    A matrix in `quantized_names` (the layers that got a GGUF method) comes as `<layer>.qweight`, its raw blocks;
    everything else as float32 values. A tied LM head in `quantized_names` gets the embedding's blocks."""
    from gguf.quants import dequantize

    permute = architecture(reader) == "llama"
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    for tensor in reader.tensors:
        if tensor.name in SKIPPED_TENSORS:
            continue
        name = hf_name(tensor.name)
        type_name = tensor.tensor_type.name
        shape = [int(dim) for dim in reversed(tensor.shape.tolist())]
        raw = torch.from_numpy(np.array(tensor.data))
        if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
            raw = unpermute_rows(raw.reshape(shape[0], -1), heads if "q_proj" in name else kv_heads)
        blocks_wanted = name in quantized_names and type_name not in FLOAT_TYPES
        if name == EMBEDDING and tied and LM_HEAD in quantized_names and type_name not in FLOAT_TYPES:
            yield "lm_head.qweight", raw
        if blocks_wanted and name != EMBEDDING:
            yield name.removesuffix(".weight") + ".qweight", raw
            continue
        if type_name in ("F32", "F16"):
            values = raw.float()
        else:
            values = torch.from_numpy(dequantize(raw.numpy(), tensor.tensor_type).astype(np.float32, copy=False))
        yield name, values.reshape(shape)
