"""Quantize, pack and unpack weights (mirrors vllm/model_executor/layers/quantization/utils/quant_utils.py).

Layouts, for a float weight `W` of shape `[out, in]` (N = out, K = in):
- int8 per output channel: `q = round(W / s)` in [-127, 127], `s = max|W[n, :]| / 127` for each row n.
- 4-bit groups (GPTQ / AWQ): each run of `group_size` inputs of a row shares a scale and an integer zero point;
  `q = clamp(round(W / s) + z, 0, 15)`, `W ~ (q - z) * s`. Round-to-nearest from the group's min and max
  (GPTQ's own algorithm also corrects the rounding error with second-order information; mini does not).
- 4-bit groups with a float minimum (llama.cpp's Q4_1 blocks): `s = (max - min) / 15`, `W ~ q * s + min`; what the
  online `gptq` path uses, since the minimum need not sit on the integer grid (exact on Q4_1-born weights).
- GPTQ checkpoint packing (AutoGPTQ's "v1" format, which vllm/model_executor/layers/quantization/auto_gptq.py
  reads): `qweight` int32 `[K / 8, N]`, eight 4-bit values of consecutive inputs per int32, input `8i + j` in
  bits `4j..4j+3`; `qzeros` int32 `[K / g, N / 8]` packed the same way along the outputs, holding `zero - 1`;
  `scales` `[K / g, N]`; `g_idx` `[K]` (`k // g` without act-order).
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8   # 4-bit values per int32
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[N, K]` float -> (int8 `[N, K]`, float32 scales `[N]`), symmetric per output row."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[N, K]` float -> (q int32 `[N, K]` in 0..15, scales `[N, K/g]`, zeros int32 `[N, K/g]`), asymmetric."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    low = w.amin(dim=-1).clamp(max=0.0)
    high = w.amax(dim=-1).clamp(min=0.0)
    scales = ((high - low) / 15.0).clamp(min=1e-8)
    zeros = torch.round(-low / scales).clamp(0, 15)
    q = torch.round(w / scales[..., None] + zeros[..., None]).clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scales, zeros.to(torch.int32)


def quantize_int4_groups_min(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[N, K]` float -> (q int32 `[N, K]` in 0..15, scales `[N, K/g]`, minimums `[N, K/g]`): `W ~ q * s + min`."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((high - low) / 15.0).clamp(min=1e-12)
    q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scales, low


def dequantize_int4_groups(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                           group_size: int) -> torch.Tensor:
    """Inverse of `quantize_int4_groups` (float32 `[N, K]`)."""
    s = scales.float().repeat_interleave(group_size, dim=1)
    z = zeros.float().repeat_interleave(group_size, dim=1)
    return (q.float() - z) * s


def pack_int4_rows(values: torch.Tensor) -> torch.Tensor:
    """int32 `[R, C]` of 4-bit values -> int32 `[R / 8, C]`: eight consecutive rows per int32 (GPTQ qweight)."""
    rows, cols = values.shape
    if rows % PACK_FACTOR:
        raise ValueError(f"cannot pack {rows} rows of 4-bit values into int32 (need a multiple of {PACK_FACTOR})")
    grouped = values.to(torch.int64).reshape(rows // PACK_FACTOR, PACK_FACTOR, cols)
    packed = (grouped << SHIFTS.to(torch.int64)[None, :, None]).sum(dim=1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4_rows`: int32 `[R / 8, C]` -> int32 `[R, C]` in 0..15."""
    rows, cols = packed.shape
    values = (packed[:, None, :] >> SHIFTS[None, :, None]) & 0xF
    return values.reshape(rows * PACK_FACTOR, cols)


def pack_gptq(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """A float `[N, K]` weight -> the tensors of a GPTQ checkpoint (v1 format, asymmetric, no act-order)."""
    n, k = weight.shape
    q, scales, zeros = quantize_int4_groups(weight, group_size)
    return {
        "qweight": pack_int4_rows(q.t().contiguous()),                 # [K/8, N]
        "qzeros": pack_int4_cols(zeros.t().contiguous() - 1),          # [K/g, N/8], v1 stores zero - 1
        "scales": scales.t().contiguous().to(torch.float16),          # [K/g, N]
        "g_idx": torch.arange(k, dtype=torch.int32) // group_size,
    }


def pack_int4_cols(values: torch.Tensor) -> torch.Tensor:
    """int32 `[R, C]` of 4-bit values (as int32, -1 allowed: stored as 15) -> int32 `[R, C / 8]`."""
    return pack_int4_rows((values & 0xF).t().contiguous()).t().contiguous()


def unpack_int4_cols(packed: torch.Tensor, *, unpack_int4_rows=unpack_int4_rows) -> torch.Tensor:
    """Inverse of `pack_int4_cols` (values 0..15)."""
    return unpack_int4_rows(packed.t().contiguous()).t().contiguous()


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int, *,
                unpack_int4_rows=unpack_int4_rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ v1 tensors -> (q int32 `[N, K]`, scales float32 `[N, K/g]`, zeros int32 `[N, K/g]`).

    `unpack_int4_rows`: the unpacker of both packed tensors (a part of the `model` role, mini/roles.py)."""
    q = unpack_int4_rows(qweight).t().contiguous()
    zeros = ((unpack_int4_cols(qzeros, unpack_int4_rows=unpack_int4_rows) + 1) & 0xF).t().contiguous()
    return q, scales.float().t().contiguous(), zeros
