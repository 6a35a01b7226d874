"""Rotary position embeddings (RoPE), with the "default", "linear" and "llama3" frequency rules.

Mirrors vllm/model_executor/layers/rotary_embedding/ (base.py and llama3_rope.py): the inverse
frequencies are computed once from the config; at run time each token's `cos`/`sin` come from its own
position, so a flat batch of unrelated requests needs no padding. The rotation is the "rotate half"
(GPT-NeoX) style used by Hugging Face Llama/Qwen checkpoints.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters_from_config(config: Any) -> dict[str, Any]:
    """`config.rope_parameters` (transformers 5.x), else the older `rope_theta` / `rope_scaling` fields."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy_scaling = getattr(config, "rope_scaling", None) or {}
    for key, value in legacy_scaling.items():
        params.setdefault(key, value)
    if "rope_type" not in params:
        params["rope_type"] = params.pop("type", "default")
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    return params


def compute_inv_freq(head_dim: int, rope_parameters: dict[str, Any]) -> torch.Tensor:
    """float32 `[head_dim // 2]` inverse frequencies, scaled as `rope_type` asks."""
    rope_type = rope_parameters.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {SUPPORTED_ROPE_TYPES}, got {rope_type!r}")
    if float(rope_parameters.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor must be 1.0 (rotary on the whole head); other values unsupported")
    base = float(rope_parameters["rope_theta"])
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    if rope_type == "linear":
        inv_freq = inv_freq / float(rope_parameters["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_scaled(inv_freq, rope_parameters)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 rule: slow down low frequencies by `factor`, keep high ones, blend in between."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    """Turns positions into `(cos, sin)` and rotates query/key heads with them."""

    def __init__(self, head_dim: int, rope_parameters: dict[str, Any]) -> None:
        self.head_dim = head_dim
        self._inv_freq_cpu = compute_inv_freq(head_dim, rope_parameters)
        self._inv_freq_by_device: dict[torch.device, torch.Tensor] = {}

    def inv_freq_on(self, device: torch.device) -> torch.Tensor:
        """The inverse frequencies on `device`, copied there on first use. mini/compilation.py asks before tracing:
        a trace that saw the copy being made would be traced again once it exists."""
        inv_freq = self._inv_freq_by_device.get(device)
        if inv_freq is None:
            inv_freq = self._inv_freq_by_device[device] = self._inv_freq_cpu.to(device)
        return inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`[T, head_dim]` cos and sin for each token position, computed in float32 then cast."""
        inv_freq = self.inv_freq_on(positions.device)
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim // 2]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[T, heads, head_dim]` by per-token `cos`/`sin` `[T, head_dim]`."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin
