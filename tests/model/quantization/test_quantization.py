"""mini/model/quantization/: packing round trips, each method against its dequantized float reference, the
engine end to end (online schemes and a GPTQ checkpoint), and bad input refused before any weight is read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.model.parallel_linear import ColumnParallelLinear
from mini.model.quantization import QUANTIZATION_METHODS, check_quantization_args, get_quantization_config
from mini.model.quantization.gptq import GPTQConfig
from mini.model.quantization.int8 import Int8PerChannelWeightOnlyConfig
from mini.model.quantization.quant_utils import (
    dequantize_int4_groups,
    pack_gptq,
    quantize_int4_groups,
    quantize_int4_groups_min,
    quantize_int8_per_channel,
    unpack_gptq,
)
from tests.conftest import build_tiny_model

PROMPTS = [{"prompt_token_ids": ids} for ids in ([1, 2, 3, 4, 5], [9, 8, 7], [100, 101, 102, 103], [42] * 6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
# The kernels read bfloat16 activations (8 mantissa bits): a product of K terms is off by about
# 2^-8 * |x| |w| sqrt(K); this bound, relative to the largest output, holds with room at these sizes.
BF16_RELATIVE_TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 2-layer random Llama whose every layer fits the int4 kernel (vocabulary 256: a multiple of 16)."""
    return build_tiny_model(tmp_path_factory.mktemp("quant_tiny"), "llama-tied", vocab_size=256)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.float()).abs().max() / want.float().abs().max())


def test_gptq_pack_round_trip():
    torch.manual_seed(0)
    weight = torch.randn(48, 128)
    q, scales, zeros = quantize_int4_groups(weight, 32)
    tensors = pack_gptq(weight, 32)
    assert tensors["qweight"].shape == (16, 48) and tensors["qzeros"].shape == (4, 6)
    q2, scales2, zeros2 = unpack_gptq(tensors["qweight"], tensors["qzeros"], tensors["scales"], 32)
    assert torch.equal(q2, q) and torch.equal(zeros2, zeros)
    assert torch.allclose(scales2, scales, rtol=1e-3)   # float16 in the checkpoint
    # 4-bit round to nearest: every weight within half a step of its group's scale
    error = (dequantize_int4_groups(q, scales, zeros, 32) - weight).abs()
    assert bool((error <= scales.repeat_interleave(32, dim=1) / 2 + 1e-6).all())


def test_online_int4_reproduces_q4_1_blocks():
    # Weights born as llama.cpp Q4_1 blocks (q * d + m, q in 0..15, every level present) come back exactly.
    torch.manual_seed(0)
    q = torch.randint(0, 16, (16, 64))
    q[:, ::32], q[:, 1::32] = 0, 15
    d, m = torch.rand(16, 2) * 0.1 + 0.01, torch.randn(16, 2) * 0.1
    weight = (q.float().reshape(16, 2, 32) * d[..., None] + m[..., None]).reshape(16, 64)
    q2, scales, minimums = quantize_int4_groups_min(weight, 32)
    assert torch.equal(q2, q.to(torch.int32))
    assert torch.allclose(scales, d, rtol=1e-5) and torch.allclose(minimums, m)


def test_int8_quantize_bounds():
    torch.manual_seed(0)
    weight = torch.randn(32, 64)
    q, scales = quantize_int8_per_channel(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert bool(((q.float() * scales[:, None] - weight).abs() <= scales[:, None] / 2 + 1e-6).all())


@pytest.mark.parametrize("config", [GPTQConfig(group_size=32), GPTQConfig(group_size=64),
                                    Int8PerChannelWeightOnlyConfig()], ids=["gptq-g32", "gptq-g64", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_method_apply_matches_dequantized_reference(config, dtype):
    torch.manual_seed(0)
    layer = ColumnParallelLinear(128, 48, bias=True, tp_rank=0, tp_size=1).to(dtype)
    weight, bias = layer.weight.detach().float().clone(), layer.bias.detach().float().clone()
    if isinstance(config, GPTQConfig):
        q, scales, minimums = quantize_int4_groups_min(weight, config.group_size)
        reference_weight = (q.float().reshape(48, -1, config.group_size) * scales[..., None]
                            + minimums[..., None]).reshape(48, 128)
    else:
        q, scales = quantize_int8_per_channel(weight)
        reference_weight = q.float() * scales[:, None]
    method = config.get_quant_method(layer, "layer")
    layer.quant_method = method
    method.create_weights(layer)
    method.process_weights_after_loading(layer)
    assert "weight" not in dict(layer.named_parameters())   # the float copy is gone
    x = torch.randn(5, 128)
    got = layer(x.to(dtype))
    assert got.dtype == dtype and got.shape == (5, 48)
    want = x @ reference_weight.t() + bias
    assert _relative_error(got, want) < BF16_RELATIVE_TOLERANCE


# How many of the 4 first greedy tokens must match float32 on this random model (its logits are peaked, yet
# 4-bit groups move them by a few tenths: 2 of 4 seen; int8's error is about 16x smaller: 4 of 4 seen).
MIN_FIRST_TOKENS_EQUAL = {"int8_per_channel_weight_only": 4, "int8_per_token": 3, "gptq": 2}


@pytest.mark.parametrize("quantization", [name for name in QUANTIZATION_METHODS if name != "gguf"])   # test_gguf.py
def test_engine_runs_each_scheme_and_mostly_agrees_with_float(tiny_dir, quantization):
    float_out = LLM(model=str(tiny_dir), skip_tokenizer_init=True).generate(PROMPTS, GREEDY, use_tqdm=False)
    quant_llm = LLM(model=str(tiny_dir), skip_tokenizer_init=True, quantization=quantization)
    quant_out = quant_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) == 8 for out in quant_out)
    first_equal = sum(a.outputs[0].token_ids[0] == b.outputs[0].token_ids[0]
                      for a, b in zip(float_out, quant_out, strict=True))
    assert first_equal >= MIN_FIRST_TOKENS_EQUAL[quantization], f"{quantization}: first tokens differ from float32"


def _write_gptq_checkpoint(float_dir, out_dir, group_size: int, lm_head: bool = True):
    """The tiny float model as a GPTQ checkpoint: every linear layer (and the head) as qweight/qzeros/scales."""
    tensors = load_file(str(float_dir / "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text())
    packed = {}
    for name, tensor in tensors.items():
        is_linear = name.endswith("_proj.weight") or (lm_head and name == "model.embed_tokens.weight")
        if not is_linear:
            packed[name] = tensor
            continue
        if name == "model.embed_tokens.weight":   # tied head: the embedding stays float, the head is packed
            packed[name] = tensor
            name = "lm_head.weight"
        prefix = name.removesuffix(".weight")
        for key, value in pack_gptq(tensor, group_size).items():
            packed[f"{prefix}.{key}"] = value
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                     "desc_act": False, "sym": False, "lm_head": lm_head}
    out_dir.mkdir(exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    save_file(packed, str(out_dir / "model.safetensors"))
    return out_dir


def _write_dequantized_checkpoint(float_dir, out_dir, group_size: int):
    """The float model whose every linear weight is replaced by its GPTQ values, dequantized (the reference)."""
    tensors = load_file(str(float_dir / "model.safetensors"))
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight"):
            packed = pack_gptq(tensor, group_size)
            q, scales, zeros = unpack_gptq(packed["qweight"], packed["qzeros"], packed["scales"], group_size)
            tensors[name] = dequantize_int4_groups(q, scales, zeros, group_size)
    out_dir.mkdir()
    (out_dir / "config.json").write_text((float_dir / "config.json").read_text())
    save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def test_gptq_checkpoint_loads_and_matches_its_dequantized_values(tiny_dir, tmp_path):
    gptq_dir = _write_gptq_checkpoint(tiny_dir, tmp_path / "gptq", group_size=64, lm_head=False)
    from_checkpoint = LLM(model=str(gptq_dir), skip_tokenizer_init=True).generate(PROMPTS, GREEDY, use_tqdm=False)
    reference_dir = _write_dequantized_checkpoint(tiny_dir, tmp_path / "dequantized", group_size=64)
    reference = LLM(model=str(reference_dir), skip_tokenizer_init=True).generate(PROMPTS, GREEDY, use_tqdm=False)
    # The same weight values; the kernel rounds activations (and scales) to bfloat16, so near-ties may part.
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids
               for a, b in zip(from_checkpoint, reference, strict=True))
    assert same >= 3


def test_unknown_scheme_names_the_allowed_ones():
    with pytest.raises(ValueError, match="quantization must be one of .*gptq.*int8_per_channel_weight_only"):
        EngineConfig(quantization="awq_marlin")
    with pytest.raises(ValueError, match="quantization must be one of"):
        get_quantization_config("Q4_K")


def test_scheme_the_device_cannot_run_is_refused():
    with pytest.raises(ValueError, match="runs on .*cpu.*not device='cuda'"):
        check_quantization_args("gptq", "cuda", 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        check_quantization_args("int8_per_channel_weight_only", "cpu", 2)


def _checkpoint_without_weights(tiny_dir, out_dir, quantization_config):
    """config.json of the tiny model, and a weights file that is not safetensors: reading it would fail."""
    config = json.loads((tiny_dir / "config.json").read_text())
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    out_dir.mkdir()
    (out_dir / "config.json").write_text(json.dumps(config))
    (out_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    return out_dir


def test_group_size_that_does_not_divide_a_layer_is_refused_before_loading(tiny_dir, tmp_path):
    bad = _checkpoint_without_weights(tiny_dir, tmp_path / "g128", {"quant_method": "gptq", "bits": 4,
                                                                     "group_size": 128, "desc_act": False})
    with pytest.raises(ValueError, match=r"group_size=128 does not divide .*in_features \(64\)"):
        LLM(model=str(bad), skip_tokenizer_init=True)


def test_checkpoint_scheme_mini_lacks_is_refused(tiny_dir, tmp_path):
    bad = _checkpoint_without_weights(tiny_dir, tmp_path / "awq", {"quant_method": "awq", "bits": 4})
    with pytest.raises(ValueError, match="quant_method must be one of"):
        LLM(model=str(bad), skip_tokenizer_init=True)


def test_output_size_the_int4_kernel_cannot_hold_is_refused(tiny_llama_dir, tmp_path):
    # The session's tiny model has a 211-token vocabulary: a 4-bit LM head would need a multiple of 16.
    bad = _checkpoint_without_weights(tiny_llama_dir, tmp_path / "head", {"quant_method": "gptq", "bits": 4,
                                                                          "group_size": 32, "lm_head": True})
    with pytest.raises(ValueError, match="out_features divisible by 16.*lm_head has 211"):
        LLM(model=str(bad), skip_tokenizer_init=True)


def test_online_gptq_gives_the_lm_head_8_bits(tiny_llama_dir):
    from mini.model.quantization.int8_per_token import Int8PerTokenLinearMethod

    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, quantization="gptq")   # vocabulary 211: fine
    assert llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    config = GPTQConfig()
    head = torch.nn.Embedding(211, 64)
    assert isinstance(config.get_quant_method(head, "lm_head"), Int8PerTokenLinearMethod)
    config.check_layer(head, "lm_head")   # no 4-bit tile to fit


def test_the_quantization_parts_are_chosen_from_the_engine_config(tiny_dir, tmp_path, monkeypatch):
    """`roles.use` (what the course's `labs.plug` calls): the engine built inside runs the replaced quantizer at
    load and the replaced unpacker on a GPTQ checkpoint; one built outside keeps mini's own."""
    from mini import roles
    from mini.model.quantization import quant_utils

    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core in this process: calls are counted
    calls = {"quantize_int8_per_channel": 0, "unpack_int4_rows": 0}

    def counting_quantize(weight):
        calls["quantize_int8_per_channel"] += 1
        return quant_utils.quantize_int8_per_channel(weight)

    def counting_unpack(packed):
        calls["unpack_int4_rows"] += 1
        return quant_utils.unpack_int4_rows(packed)

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    small = {"dtype": "bfloat16", "skip_tokenizer_init": True, "num_gpu_blocks_override": 16}
    reference = LLM(model=str(tiny_dir), quantization="int8_per_channel_weight_only", **small).generate(
        PROMPTS[:2], params, use_tqdm=False)
    with roles.use(quantize_int8_per_channel=counting_quantize):
        llm = LLM(model=str(tiny_dir), quantization="int8_per_channel_weight_only", **small)
    assert calls["quantize_int8_per_channel"] > 0   # every linear layer and the head, at load
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], params, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in reference]

    gptq_dir = _write_gptq_checkpoint(tiny_dir, tmp_path / "gptq", 32)
    with roles.use(unpack_int4_rows=counting_unpack):
        LLM(model=str(gptq_dir), **small)
    assert calls["unpack_int4_rows"] > 0           # qweight and qzeros of every layer
    before = dict(calls)
    LLM(model=str(gptq_dir), **small)               # built outside: mini's own unpacker
    assert calls == before
