"""The llama.cpp peer of `python -m mini bench` (mini/bench/llamacpp.py, gguf_float32.py, llamacpp_batch.py).

What runs everywhere: the float32 copy of a quantized GGUF file (every value equal to the dequantized original,
the metadata equal key for key, written once) and the message without llama-cpp-python. With llama-cpp-python
and SmolLM2 installed (`pip install -e '.[llamacpp]'`, not in CI), the batched llama.cpp runner is held to
llama-cpp-python's own one-sequence-at-a-time generation.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.util

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize

from mini.bench import gguf_float32, llamacpp


def write_small_quantized_gguf(path) -> dict[str, np.ndarray]:
    """A GGUF file with Q4_1, Q8_0 and F32 tensors and metadata of several types; returns the float tensors."""
    rng = np.random.default_rng(0)
    tensors = {"blk.0.attn_q.weight": (rng.standard_normal((8, 64)), gguf.GGMLQuantizationType.Q4_1),
               "token_embd.weight": (rng.standard_normal((16, 64)), gguf.GGMLQuantizationType.Q8_0),
               "blk.0.attn_norm.weight": (rng.standard_normal(64), gguf.GGMLQuantizationType.F32)}
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_file_type(3)                       # MOSTLY_Q4_1
    for name, (values, kind) in tensors.items():
        values = values.astype(np.float32)
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {name: values for name, (values, _) in tensors.items()}


def test_the_float32_copy_holds_the_dequantized_values_and_the_same_metadata(tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "small.Q4_1.gguf"
    write_small_quantized_gguf(source)
    copy = gguf_float32.float32_gguf(source)
    original, converted = gguf.GGUFReader(source), gguf.GGUFReader(copy)
    assert [t.name for t in converted.tensors] == [t.name for t in original.tensors]
    for before, after in zip(original.tensors, converted.tensors, strict=True):
        assert after.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(after.shape) == list(before.shape)
        np.testing.assert_array_equal(np.asarray(after.data), dequantize(before.data, before.tensor_type))
    assert converted.fields["general.file_type"].contents() == gguf_float32.ALL_F32
    for name, field in original.fields.items():
        if name.startswith("GGUF.") or name == "general.file_type":
            continue
        assert converted.fields[name].contents() == field.contents(), name
        assert converted.fields[name].types == field.types, name
    # Written once: a second call returns the same file untouched, and nothing partial is left beside it.
    written = copy.stat().st_mtime_ns
    assert gguf_float32.float32_gguf(source) == copy and copy.stat().st_mtime_ns == written
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]


def test_the_quantized_tensor_really_changes_in_the_copy(tmp_path, monkeypatch):
    """The control: the Q4_1 tensor's float32 values differ from the originals the file was made from (the
    copy carries what the file holds, not what was quantized)."""
    monkeypatch.setenv("MINI_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "small.Q4_1.gguf"
    floats = write_small_quantized_gguf(source)
    copy = gguf.GGUFReader(gguf_float32.float32_gguf(source))
    stored = {t.name: np.asarray(t.data) for t in copy.tensors}
    assert not np.array_equal(stored["blk.0.attn_q.weight"], floats["blk.0.attn_q.weight"].astype(np.float32))
    np.testing.assert_allclose(stored["blk.0.attn_q.weight"], floats["blk.0.attn_q.weight"], atol=0.5)


def test_without_llama_cpp_python_the_bench_says_how_to_install_it(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_llama_cpp(name, *args, **kwargs):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama_cpp)
    assert llamacpp.compare(argparse.Namespace()) == 2
    assert "pip install -e '.[llamacpp]'" in capsys.readouterr().out


def _smollm2_gguf() -> str | None:
    try:
        return llamacpp.gguf_file_for("HuggingFaceTB/SmolLM2-135M-Instruct")
    except SystemExit:
        return None


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or _smollm2_gguf() is None,
                    reason="needs llama-cpp-python (pip install -e '.[llamacpp]') and SmolLM2's GGUF")
def test_the_batched_runner_gives_llama_cpp_python_s_own_greedy_tokens():
    from llama_cpp import Llama

    from mini.bench.llamacpp_batch import BatchedLlamaCpp
    from mini.bench.workload import Workload

    llama = Llama(model_path=_smollm2_gguf(), n_ctx=128, n_threads=2, n_threads_batch=2, verbose=False)
    work = Workload([[504, 3458, 314, 253, 1024], [28, 339, 2367], [9690, 198, 4093, 1145, 30, 5, 17]], [6, 3, 5])
    _, sequential = llamacpp.run_llamacpp(llama, work)
    batched = BatchedLlamaCpp(llama, num_sequences=3, max_len=64)
    try:
        _, together = batched.generate(work)
        _, again = batched.generate(work)          # the memory is cleared between runs
    finally:
        batched.close()
    assert [len(out) for out in together] == work.output_lens
    assert together == sequential == again


@pytest.mark.parametrize("kind", ["bf16", "q8_0", "q4_0"])
def test_the_requantized_copies_hold_matrices_of_that_type(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("MINI_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "small.Q4_1.gguf"
    write_small_quantized_gguf(source)
    copy = gguf_float32.requantized_gguf(source, kind)
    assert copy.name.endswith(f".{kind.upper()}.gguf")
    original = {t.name: t for t in gguf.GGUFReader(source).tensors}
    wanted = gguf.GGMLQuantizationType[kind.upper()]
    # A 4-bit block of 32 is off by at most half a step: (max - min) / 15 / 2 of the block; 8-bit and bf16 far less.
    tolerance = {"bf16": 0.02, "q8_0": 0.03, "q4_0": 0.5}[kind]
    for tensor in gguf.GGUFReader(copy).tensors:
        before = dequantize(original[tensor.name].data, original[tensor.name].tensor_type)
        after = dequantize(tensor.data, tensor.tensor_type)
        is_matrix = len(tensor.shape) == 2
        assert tensor.tensor_type == (wanted if is_matrix else gguf.GGMLQuantizationType.F32)
        assert np.abs(after - before).max() <= tolerance * np.abs(before).max()
    with pytest.raises(ValueError, match="kind must be one of"):
        gguf_float32.requantized_gguf(source, "q4_k")


def test_matching_weights_follow_minis_precision():
    def args(dtype, quantization):
        return argparse.Namespace(dtype=dtype, quantization=quantization)

    assert llamacpp.matching_llamacpp_weights(args("float32", None)) == "f32"
    assert llamacpp.matching_llamacpp_weights(args("bfloat16", None)) == "bf16"
    assert llamacpp.matching_llamacpp_weights(args("bfloat16", "int8_per_channel_weight_only")) == "q8_0"
    assert llamacpp.matching_llamacpp_weights(args("bfloat16", "gptq")) == "q4_0"
    assert llamacpp.matching_llamacpp_weights(args("bfloat16", "gguf")) == "gguf"   # the same blocks as stored
