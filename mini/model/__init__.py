"""The decoder models and their loader.

Mirrors vllm/model_executor/models/ (the model zoo, here one Llama-family file) and
vllm/model_executor/model_loader/ (reading a local checkpoint).
"""

from __future__ import annotations

from mini.model.llama import DecoderConfig, LlamaForCausalLM
from mini.model.loader import load_model

__all__ = ["DecoderConfig", "LlamaForCausalLM", "load_model"]
