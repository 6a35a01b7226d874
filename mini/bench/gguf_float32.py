"""A float32 copy of a quantized GGUF file, for comparing mini and llama.cpp float for float.

Mirrors no vLLM file (vLLM has no llama.cpp peer). SmolLM2-135M-Instruct ships only as Q4_1. mini dequantizes
it to float32 and computes in float32 (mini/model/gguf_loader.py). llama.cpp multiplies the 4-bit blocks as
stored, with activations quantized to 8 bits. So the two differ in arithmetic and in the bytes read for each
weight, not in the weights' values. This module writes the values mini computes with into a GGUF whose tensors
are all F32 (`general.file_type` 0, "ALL_F32"). The metadata is copied key for key: architecture, shapes,
tokenizer, chat template. llama.cpp then reads the same numbers as mini, at the same precision.

The copy lives in `$MINI_CACHE_DIR/gguf-f32/<file stem>-<key>.F32.gguf` (the cache of mini/model/gguf_loader.py,
same key: the source's path, size and modification time). It is written under a temporary name and renamed into
place when complete. SmolLM2's is 540 MB, written in about 8 s on 2 cores.

`requantized_gguf(path, "bf16" | "q8_0" | "q4_0")` writes the same copy with every matrix (2-D tensor) stored in
that llama.cpp type instead, quantized by the `gguf` package's own writer from those float32 values (norms stay
F32): llama.cpp's peer of mini's bfloat16, int8 and int4 runs (mini/bench/llamacpp.py). Q8_0 is int8 in blocks of
32 with a float16 scale, Q4_0 4-bit in blocks of 32 with a float16 scale (symmetric); no importance matrix.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mini.model.gguf_loader import cache_root, cached_folder_for

ALL_F32 = 0   # llama_ftype LLAMA_FTYPE_ALL_F32: what `general.file_type` says of a file of F32 tensors
# llama_ftype of a file whose matrices are all of one type (llama.h: MOSTLY_Q4_0 2, MOSTLY_Q8_0 7, MOSTLY_BF16 32).
FILE_TYPES = {"f32": ALL_F32, "bf16": 32, "q8_0": 7, "q4_0": 2}
WRITER_OWNED_KEYS = ("GGUF.", "general.architecture")   # written by GGUFWriter itself


def float32_path_for(gguf_path: Path) -> Path:
    return cache_root() / "gguf-f32" / f"{cached_folder_for(gguf_path).name}.F32.gguf"


def float32_gguf(gguf_path: str | Path) -> Path:
    """The F32 copy of `gguf_path` (module docstring), written on first use."""
    return requantized_gguf(gguf_path, "f32")


def requantized_gguf(gguf_path: str | Path, kind: str) -> Path:
    """The copy of `gguf_path` with its matrices in `kind` (one of FILE_TYPES), written on first use."""
    if kind not in FILE_TYPES:
        raise ValueError(f"kind must be one of {tuple(FILE_TYPES)}, got {kind!r}")
    source = Path(os.path.expanduser(str(gguf_path)))
    target = float32_path_for(source)
    if kind != "f32":
        target = target.with_name(target.name.replace(".F32.gguf", f".{kind.upper()}.gguf"))
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        write_float32_copy(source, partial, kind)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def write_float32_copy(source: Path, target: Path, kind: str = "f32") -> None:
    """Copy every metadata key of `source` and every tensor, dequantized to float32, into `target` (with
    `kind` != "f32": every matrix then quantized to that type)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    reader = GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(target, architecture)
    for name, field in reader.fields.items():
        if name.startswith(WRITER_OWNED_KEYS):
            continue
        if name == "general.file_type":
            writer.add_file_type(FILE_TYPES[kind])
            continue
        value_type = field.types[0]
        sub_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        values = values.reshape([int(dim) for dim in reversed(tensor.shape)])
        if kind == "f32" or values.ndim != 2:
            writer.add_tensor(tensor.name, values)
            continue
        quant_type = GGMLQuantizationType[kind.upper()]
        writer.add_tensor(tensor.name, quantize(values, quant_type), raw_dtype=quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


__all__ = ["FILE_TYPES", "float32_gguf", "float32_path_for", "requantized_gguf", "write_float32_copy"]
