"""mini.model: Llama / Qwen2 / Qwen3 on the paged KV cache == transformers on the full sequence."""

from __future__ import annotations

import json

import pytest
import torch

import mini.attention.reference as attn
from mini.config import EngineConfig
from mini.model.llama import LlamaForCausalLM, rms_norm
from mini.model.loader import load_model
from mini.worker.prepare_inputs import prepare_inputs

BLOCK_SIZE = 4
NUM_BLOCKS = 32
COMMON = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
ARCHS = {
    "llama-untied": ("LlamaConfig", {"tie_word_embeddings": False}),
    "llama-tied-bias": ("LlamaConfig", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    "llama3-rope": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
}


def save_random_model(directory, arch: str, **save_kwargs):
    """Every parameter random (biases and norm weights too, so a skipped one shows up)."""
    import transformers

    class_name, extra = ARCHS[arch]
    config = getattr(transformers, class_name)(**COMMON, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0, 0.15)
    model.save_pretrained(directory, **save_kwargs)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (transformers model, folder), built once per module."""
    cache = {}

    def get(arch):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch)
            cache[arch] = (save_random_model(folder, arch), folder)
        return cache[arch]

    return get


class PagedRun:
    """Feeds one request through the model chunk by chunk, as the runner would."""

    def __init__(self, model: LlamaForCausalLM, dtype=torch.float32):
        self.model = model
        shape = model.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)
        self.kv_caches = [torch.zeros(shape, dtype=dtype) for _ in range(model.config.num_hidden_layers)]
        # 8 blocks (32 tokens) per request, deliberately out of order
        self.block_ids = (torch.randperm(NUM_BLOCKS - 1, generator=torch.Generator().manual_seed(0)) + 1).tolist()

    def step(self, requests: list[tuple[list[int], int, int]]) -> torch.Tensor:
        """requests: (all token ids, num_computed, num_scheduled); returns logits of EVERY scheduled token."""
        blocks = [self.block_ids[8 * i: 8 * (i + 1)] for i in range(len(requests))]
        inputs = prepare_inputs([r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests],
                                blocks, BLOCK_SIZE)
        metadata = attn.AttentionMetadata(
            num_actual_tokens=len(inputs.input_ids), query_start_loc=inputs.query_start_loc,
            seq_lens=inputs.seq_lens, block_table=inputs.block_table, slot_mapping=inputs.slot_mapping,
            max_query_len=max(r[2] for r in requests), max_seq_len=int(inputs.seq_lens.max()))
        with torch.inference_mode():
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, metadata)
            return self.model.compute_logits(hidden)


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_prefill_then_decode_matches_transformers(models, arch):
    hf_model, folder = models(arch)
    model, _ = load_model(folder)
    run = PagedRun(model)
    tokens = torch.randint(0, 128, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    logits = run.step([(tokens, 0, len(tokens))])
    torch.testing.assert_close(logits, hf_logits(hf_model, tokens), atol=1e-4, rtol=1e-4)
    for _ in range(4):  # greedy decode, one token per step, through the cache
        tokens.append(int(logits[-1].argmax()))
        logits = run.step([(tokens, len(tokens) - 1, 1)])
        torch.testing.assert_close(logits[0], hf_logits(hf_model, tokens)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama-untied", "qwen3"])
def test_chunked_prefill_matches_transformers(models, arch):
    hf_model, folder = models(arch)
    model, _ = load_model(folder)
    run = PagedRun(model)
    tokens = torch.randint(0, 128, (13,), generator=torch.Generator().manual_seed(2)).tolist()
    expected = hf_logits(hf_model, tokens)
    done = 0
    for chunk in (5, 6, 2):  # chunks cross block boundaries at different offsets
        logits = run.step([(tokens, done, chunk)])
        torch.testing.assert_close(logits, expected[done:done + chunk], atol=1e-4, rtol=1e-4)
        done += chunk


def test_mixed_batch_of_prefill_chunk_and_decodes(models):
    hf_model, folder = models("qwen2")
    model, _ = load_model(folder)
    run = PagedRun(model)
    gen = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(0, 128, (n,), generator=gen).tolist() for n in (6, 3, 10))
    run.step([(a, 0, 5), (b, 0, 2), (c, 0, 4)])
    logits = run.step([(a, 5, 1), (b, 2, 1), (c, 4, 6)])  # two decodes + the rest of a prefill
    torch.testing.assert_close(logits[0], hf_logits(hf_model, a)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], hf_logits(hf_model, b)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[2:], hf_logits(hf_model, c)[4:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_loads_and_runs(models, dtype):
    _, folder = models("llama-untied")
    model, _ = load_model(folder, dtype=dtype)
    assert all(p.dtype == getattr(torch, dtype) for p in model.parameters())
    full, _ = load_model(folder)
    tokens = list(range(1, 10))
    half_logits = PagedRun(model, dtype=getattr(torch, dtype)).step([(tokens, 0, 9)])
    full_logits = PagedRun(full).step([(tokens, 0, 9)])
    assert half_logits.dtype == torch.float32 and torch.isfinite(half_logits).all()
    assert (half_logits - full_logits).abs().max() < 0.1 * full_logits.abs().max()


def test_loader_returns_config_and_ties_weights(models):
    _, folder = models("qwen3")
    model, hf_config = load_model(folder)
    assert hf_config.vocab_size == 128 and hf_config.model_type == "qwen3"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied, _ = load_model(models("llama-untied")[1])
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_loader_reads_sharded_checkpoints(tmp_path, models):
    hf_model = save_random_model(tmp_path, "llama-untied", max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model, _ = load_model(tmp_path)
    tokens = [3, 1, 4, 1, 5]
    torch.testing.assert_close(PagedRun(model).step([(tokens, 0, 5)]), hf_logits(hf_model, tokens),
                               atol=1e-4, rtol=1e-4)


def test_loader_errors_are_clear(tmp_path, models):
    with pytest.raises(ValueError, match="existing local folder"):
        load_model(tmp_path / "nope")
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)
    _, folder = models("llama-untied")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ValueError, match="safetensors"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(folder, dtype="int8")


def test_unsupported_configs_raise(models):
    _, folder = models("llama-untied")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type must be one of"):
        LlamaForCausalLM(config)
    config["model_type"] = "gpt2"
    with pytest.raises(ValueError, match="model_type must be one of"):
        LlamaForCausalLM(config)


def test_a_model_built_with_choices_runs_its_parts(models):
    """Parts chosen when the model is loaded (paged_attention, rms_norm) run in every layer of that model;
    a model loaded without them keeps the reference."""
    _, folder = models("llama-untied")
    calls = []

    def spy_attention(query, kv_cache, metadata, scale):
        calls.append(("paged_attention", tuple(query.shape)))
        return attn.paged_attention(query, kv_cache, metadata, scale)

    def spy_norm(x, weight, eps):
        calls.append(("rms_norm", tuple(x.shape)))
        return rms_norm(x, weight, eps)

    model, _ = load_model(folder, config=EngineConfig(parts={"paged_attention": spy_attention, "rms_norm": spy_norm}))
    assert type(model).__bases__ == (LlamaForCausalLM,) and type(model).rms_norm is spy_norm
    assert type(model.attention_backend).paged_attention is spy_attention
    PagedRun(model).step([([1, 2, 3], 0, 3)])
    assert calls.count(("paged_attention", (3, 4, 16))) == 2  # once per layer
    assert calls.count(("rms_norm", (3, 64))) == 5  # two per layer, then the final norm
    calls.clear()
    PagedRun(load_model(folder)[0]).step([([1, 2, 3], 0, 3)])
    assert calls == []
