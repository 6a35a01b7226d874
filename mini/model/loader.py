"""Load a Hugging Face Llama / Qwen2 / Qwen3 checkpoint from a LOCAL folder (never the hub).

Mirrors vllm/model_executor/model_loader/default_loader.py (find the *.safetensors files, single or
sharded through model.safetensors.index.json, and stream their tensors into the model) and
weight_utils.py (`safetensors_weights_iterator`). mini's parameter names equal the checkpoint's, so
each tensor is copied into the parameter of the same name; a tied `lm_head.weight` may be absent. With
tensor parallelism the parameter is this rank's shard: the layer's `weight_loader(param, full_tensor)` keeps
the rows / columns it owns (vLLM's design, mini/model/parallel_linear.py), so one checkpoint serves any size.

`load_model` returns `(model, hf_config)` where `hf_config` is the transformers `PretrainedConfig`
read by `AutoConfig.from_pretrained(model_dir)` from the folder's config.json (offline). The model's class is
`roles.resolve(config, LlamaForCausalLM)` (the `model` role's parts in `config.parts`, mini/roles.py) and its
layers hold one attention backend resolved from the same config.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from mini import roles
from mini.attention import build_attention_backend
from mini.model.gguf_loader import gguf_source
from mini.model.gguf_weights import iterate_gguf, open_gguf
from mini.model.llama import LlamaForCausalLM
from mini.model.parallel_linear import ColumnParallelLinear, RowParallelLinear
from mini.model.quantization import QuantizationConfig, resolve_quant_config
from mini.model.quantization.gguf import GGUFConfig, GGUFLinearMethod
from mini.model.vocab_parallel_embedding import ParallelLMHead

DTYPES_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARD_INDEX_FILE = "model.safetensors.index.json"
# Buffers some old checkpoints saved; mini recomputes them.
IGNORED_CHECKPOINT_SUFFIXES = ("rotary_emb.inv_freq",)


def attach_quant_methods(model: torch.nn.Module, quant_config: QuantizationConfig | None, config: Any = None) -> None:
    """Give every linear layer (and the LM head) its method, after checking its shape fits the scheme (vLLM's layers
    ask `quant_config.get_quant_method` in their constructors; mini's model is built first, on meta, then here).

    `config`: the engine's EngineConfig; a method whose parts it replaces (the `model` role of mini/roles.py) becomes
    the subclass `roles.resolve` builds, which adds only class attributes, so the instance simply changes class."""
    if quant_config is None:
        return
    layers = [(prefix, module) for prefix, module in model.named_modules()
              if isinstance(module, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead))]
    methods = []
    for prefix, layer in layers:
        method = quant_config.get_quant_method(layer, prefix)
        if method is not None:
            method.__class__ = roles.resolve(config, type(method))  # the same class when nothing is replaced
            quant_config.check_layer(layer, prefix)
            methods.append((layer, method))
    for layer, method in methods:
        layer.quant_method = method
        method.create_weights(layer)


def process_weights_after_loading(model: torch.nn.Module) -> None:
    """Let every layer's method pack what was loaded (vLLM: `process_weights_after_loading` in
    vllm/model_executor/model_loader/utils.py)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def load_model(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    attention_backend: str = "torch",
    config: Any = None,
    quantization: str | None = None,
) -> tuple[LlamaForCausalLM, Any]:
    """Build the model described by `model_dir/config.json` and fill it from its safetensors files.

    `config`: the engine's EngineConfig, whose `parts` pick the model's and the backend's classes (None: none).
    `quantization` (or the checkpoint's `quantization_config`) picks a scheme of mini/model/quantization/: its
    methods are attached to the meta-device model, checking every layer's shape before any weight is read, and
    pack the weights once they are loaded (vLLM: `process_weights_after_loading`). `quantization="gguf"` reads
    every tensor from the folder's GGUF file instead of safetensors, its blocks kept (mini/model/gguf_weights.py)."""
    folder = Path(model_dir)
    torch_dtype = resolve_dtype(dtype)
    if not folder.is_dir():
        raise ValueError(f"model_dir must be an existing local folder, got {str(folder)!r}")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model_dir {str(folder)!r} has no config.json (need a Hugging Face model folder)")
    hf_config = read_hf_config(folder)
    if quantization == "gguf":   # the blocks of the folder's GGUF file (mini/model/quantization/gguf.py)
        reader, quant_config = open_gguf_checkpoint(folder, hf_config, torch_dtype)
    else:
        quant_config = resolve_quant_config(quantization, hf_config)
        weight_files = find_safetensors_files(folder)

    backend = build_attention_backend(attention_backend, config)
    with torch.device("meta"):  # no time spent on random init: every tensor comes from the checkpoint
        model = roles.resolve(config, LlamaForCausalLM)(hf_config, attention_backend=backend)
        attach_quant_methods(model, quant_config, config)
    model.to(torch_dtype)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives each module its own storage; share the tied weight again
    if quantization == "gguf":
        load_weights(model, iterate_gguf(reader, hf_config, gguf_quantized_names(model)))
    else:
        load_weights(model, iterate_checkpoint(weight_files))
    process_weights_after_loading(model)
    return model.eval(), hf_config


def open_gguf_checkpoint(folder: Path, hf_config: Any, dtype: torch.dtype) -> tuple[Any, GGUFConfig]:
    """The GGUF file behind `folder` (mini/model/gguf_loader.py `gguf_source`), opened, and its `GGUFConfig`."""
    path = gguf_source(folder)
    if path is None:
        raise ValueError(f"quantization='gguf' needs a GGUF model: {str(folder)!r} holds no single *.gguf file and "
                         "was not converted from one (pass model=a .gguf file or a packaged GGUF model)")
    if getattr(hf_config, "quantization_config", None):
        raise ValueError("quantization='gguf' does not match the folder's config.json quantization_config")
    reader = open_gguf(path)
    return reader, GGUFConfig.from_reader(path, reader, hf_config, dtype)


def gguf_quantized_names(model: torch.nn.Module) -> set[str]:
    """`<layer>.weight` of every layer that holds GGUF blocks (the others read floats from the file)."""
    return {f"{prefix}.weight" for prefix, module in model.named_modules()
            if isinstance(getattr(module, "quant_method", None), GGUFLinearMethod)}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES_BY_NAME.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[dtype]
    raise ValueError(f"dtype must be one of {tuple(DTYPES_BY_NAME)} (or the torch dtype), got {dtype!r}")


def read_hf_config(folder: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


def find_safetensors_files(folder: Path) -> list[Path]:
    """The shards listed in model.safetensors.index.json, else every *.safetensors file in the folder."""
    index_path = folder / SHARD_INDEX_FILE
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [str(path.name) for path in files if not path.is_file()]
        if missing:
            raise ValueError(f"{SHARD_INDEX_FILE} in {str(folder)!r} lists missing shard files: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model_dir {str(folder)!r} has no *.safetensors weights (mini reads safetensors only)")
    return files


def iterate_checkpoint(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every file, one at a time (on the CPU)."""
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as shard:
            for name in shard.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, shard.get_tensor(name)


def load_weights(model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Copy each checkpoint tensor into the parameter with the same name; check nothing is left out.

    A parameter of a parallel layer (one with a `weight_loader`) gets the full tensor through it: the layer
    checks the shape and keeps this rank's shard. The others are copied whole (replicated on every rank). A
    packed tensor of a quantization method is loaded by the layer's `param_weight_loaders[name]`."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaders = {f"{prefix}.{name}" if prefix else name:
               getattr(module, "param_weight_loaders", {}).get(name, module.weight_loader)
               for prefix, module in model.named_modules(remove_duplicate=False)
               if callable(getattr(module, "weight_loader", None))
               for name, _ in module.named_parameters(recurse=False, remove_duplicate=False)}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in weights:
        if name.endswith(IGNORED_CHECKPOINT_SUFFIXES):
            continue
        if name not in params:
            unexpected.append(name)
            continue
        param = params[name]
        if name in loaders:
            with torch.no_grad():
                loaders[name](param, tensor.to(param.dtype))
            loaded.add(name)
            continue
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, model expects "
                             f"{tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        loaded.add(name)
    if unexpected:
        raise ValueError(f"checkpoint has tensors the model does not know: {unexpected[:5]}")
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and "model.embed_tokens.weight" in loaded:
        loaded.add("lm_head.weight")
    if tied and "lm_head.weight" in loaded:
        loaded.add("model.embed_tokens.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing model weights: {missing[:5]}")
