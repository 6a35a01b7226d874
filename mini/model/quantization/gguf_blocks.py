"""GGUF's Q4_0, Q4_1 and Q8_0 blocks, read back as 4-bit planes for PyTorch's CPU int4 kernel.

Mirrors the block formats vLLM's GGUF method reads (its kernels are in `vllm/_custom_ops.py`; the block layouts
are llama.cpp's `ggml-common.h`, which the `gguf` package's `gguf/quants.py` also decodes). A row of K weights is
K / 32 blocks, stored back to back as bytes:

    type   bytes  block                              weight k of the block (j = k mod 16)
    Q4_0   18     d f16, qs[16]                      (q - 8) * d,  q = low nibble of qs[j] (k < 16) else high
    Q4_1   20     d f16, m f16, qs[16]               q * d + m,    q as Q4_0
    Q8_0   34     d f16, qs[32] int8                 q * d

`_weight_int4pack_mm_for_cpu` computes `w = (q - 8) * scale + zero` per group of 32 (cpu_kernels.py), so:
- Q4_0 -> scale d, zero 0; Q4_1 -> scale d, zero m + 8d (both exactly the block's values in float32);
- Q8_0 has 8-bit codes, which no 4-bit kernel holds in one plane. Its unsigned code u = q + 128 (0..255) is
  16 h + l with h, l in 0..15, so `q * d = (h - 8) * 16d + (l - 8) * d + 8d`: two 4-bit planes with the same
  groups, the high one with scale 16d and zero 0, the low one with scale d and zero 8d. The layer runs both
  planes and adds them: 8 bits read per weight, as Q8_0, and every weight still exactly `q * d`.
A per-channel int8 kernel (`_weight_int8pack_mm`) cannot hold Q8_0 losslessly: a row has K / 32 different
scales d, and `q * d_block` is in general no integer multiple of one row scale.

Every function here is pure tensor code; `decode_blocks(raw, type_name)` -> list of `(q, scales, offsets)` planes,
`w = q * scale + offset` group by group (offset: Q4_0 -8d, Q4_1 m, Q8_0 planes -128d and 0).
"""

from __future__ import annotations

import torch

BLOCK_SIZE = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
QUANTIZED_TYPES = tuple(BLOCK_BYTES)


def row_bytes(type_name: str, in_features: int) -> int:
    """Bytes of one row of `in_features` weights in `type_name` blocks."""
    return in_features // BLOCK_SIZE * BLOCK_BYTES[type_name]


def _blocks(raw: torch.Tensor, type_name: str) -> torch.Tensor:
    """uint8 `[N, row_bytes]` -> uint8 `[N, K / 32, block_bytes]`."""
    rows, size = raw.shape
    return raw.contiguous().view(rows, size // BLOCK_BYTES[type_name], BLOCK_BYTES[type_name])


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at bytes `offset..offset+1` of every block, as float32 `[N, K / 32]`."""
    return blocks[..., offset:offset + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 `[N, B, 16]` -> int32 `[N, B * 32]`: the low nibbles are weights 0..15, the high ones 16..31."""
    q = torch.cat([qs & 0xF, qs >> 4], dim=-1).to(torch.int32)
    return q.reshape(q.shape[0], -1)


def decode_blocks(raw: torch.Tensor, type_name: str) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The planes of one tensor's blocks: `[(q int32 [N, K] in 0..15, scales [N, K/32], offsets [N, K/32])]`."""
    if type_name not in QUANTIZED_TYPES:
        raise ValueError(f"GGUF type {type_name!r} is not one of the block types mini serves {QUANTIZED_TYPES}")
    blocks = _blocks(raw, type_name)
    d = _half(blocks, 0)
    if type_name == "Q4_0":
        return [(_nibbles(blocks[..., 2:]), d, -8.0 * d)]
    if type_name == "Q4_1":
        return [(_nibbles(blocks[..., 4:]), d, _half(blocks, 2))]
    codes = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int32) + 128     # Q8_0: u = q + 128
    codes = codes.reshape(codes.shape[0], -1)
    return [(codes >> 4, 16.0 * d, -128.0 * d), (codes & 0xF, d, torch.zeros_like(d))]


def dequantize_planes(planes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """float32 `[N, K]`: the sum over planes of `q * scale + offset` (the reference the kernel must match)."""
    total = None
    for q, scales, offsets in planes:
        n, k = q.shape
        w = (q.float().reshape(n, k // BLOCK_SIZE, BLOCK_SIZE) * scales[..., None] + offsets[..., None]).reshape(n, k)
        total = w if total is None else total + w
    return total

