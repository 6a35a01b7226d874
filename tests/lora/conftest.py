"""Fixtures of the LoRA tests: a tiny random Llama and three PEFT adapters for it, built once per session."""

from __future__ import annotations

import pytest

from tests.lora.adapters import make_adapter


@pytest.fixture(scope="session")
def lora_adapters(tiny_llama_dir, tmp_path_factory):
    """{"a": r=4 every projection, "b": r=8 rsLoRA on q/v/down, "c": r=2 on o/gate/up} for the tiny Llama."""
    root = tmp_path_factory.mktemp("lora-adapters")
    return {
        "a": make_adapter(tiny_llama_dir, root / "a", r=4, alpha=8, seed=1),
        "b": make_adapter(tiny_llama_dir, root / "b", r=8, alpha=4, seed=2, use_rslora=True,
                          targets=["q_proj", "v_proj", "down_proj"]),
        "c": make_adapter(tiny_llama_dir, root / "c", r=2, alpha=2, seed=3, targets=["o_proj", "gate_proj", "up_proj"]),
    }
