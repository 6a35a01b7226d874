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
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mini.model.gguf_loader import cache_root, cached_folder_for

ALL_F32 = 0   # llama_ftype LLAMA_FTYPE_ALL_F32: what `general.file_type` says of a file of F32 tensors
WRITER_OWNED_KEYS = ("GGUF.", "general.architecture")   # written by GGUFWriter itself


def float32_path_for(gguf_path: Path) -> Path:
    return cache_root() / "gguf-f32" / f"{cached_folder_for(gguf_path).name}.F32.gguf"


def float32_gguf(gguf_path: str | Path) -> Path:
    """The F32 copy of `gguf_path` (module docstring), written on first use."""
    source = Path(os.path.expanduser(str(gguf_path)))
    target = float32_path_for(source)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        write_float32_copy(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def write_float32_copy(source: Path, target: Path) -> None:
    """Copy every metadata key of `source` and every tensor, dequantized to float32, into `target`."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(target, architecture)
    for name, field in reader.fields.items():
        if name.startswith(WRITER_OWNED_KEYS):
            continue
        if name == "general.file_type":
            writer.add_file_type(ALL_F32)
            continue
        value_type = field.types[0]
        sub_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        writer.add_tensor(tensor.name, values.reshape([int(dim) for dim in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


__all__ = ["float32_gguf", "float32_path_for", "write_float32_copy"]
