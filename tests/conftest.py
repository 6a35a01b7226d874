"""Shared fixtures: tiny random-weight Hugging Face checkpoints built from configs (never downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest
import torch

# Under `pytest -n N` every worker would start torch with one thread per core: N x cores threads fighting
# over the cores (measured: a 10x slowdown of the model tests on 2 cores). One thread per worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

TINY_ARCHS = {
    # name: (config class name, extra config kwargs)
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama-untied": ("LlamaConfig", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
}


def build_tiny_model(directory: Path, arch: str, seed: int = 0, vocab_size: int = 211) -> Path:
    """Save a 2-layer random model of `arch` (GQA: 4 query heads, 2 KV heads) to `directory`.

    initializer_range is large so logits are peaked: greedy argmax ties (which would make any two
    correct implementations diverge) are then rare.
    """
    import transformers

    class_name, extra = TINY_ARCHS[arch]
    config = getattr(transformers, class_name)(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if arch == "qwen2":  # make the attention biases non-zero so they are really exercised
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory(arch) -> a folder with config.json + model.safetensors (cached per session)."""
    cache: dict[str, Path] = {}

    def make(arch: str = "llama-tied") -> Path:
        if arch not in cache:
            cache[arch] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_factory) -> Path:
    return tiny_model_factory("llama-tied")
