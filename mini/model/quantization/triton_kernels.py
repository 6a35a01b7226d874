"""Triton dequant-matmul kernels for 4-bit (GPTQ layout) and int8 (per-row scale) weights, for CUDA.

Mirrors vllm/model_executor/layers/quantization/awq_triton.py (vLLM's Triton AWQ GEMM: unpack the 4-bit
values of a tile, dequantize with the group's scale and zero, multiply in the tile): the same idea on GPTQ's
layout. One program computes a `[BLOCK_M, BLOCK_N]` tile of `out = x @ W^T`, walking K in `BLOCK_K` steps: it
loads the packed int32 words of the tile, shifts out each input's nibble, subtracts the zero point, scales, and
accumulates `tl.dot` in float32. Weights are read in their packed form and never expanded in memory.

Layouts (mini/model/quantization/quant_utils.py): `qweight` int32 `[K / 8, N]` (input `8i + j` in bits
`4j..4j+3` of row i), `scales` and `zeros` float32 `[K / g, N]` (`w = (q - zero) * scale`); int8: `weight`
`[N, K]` and `scales` `[N]`. Tested under TRITON_INTERPRET=1 with tiny shapes (each program step costs ms
there), natively by `python -m mini bench gpu`. The dot runs in float32 (under the interpreter a bfloat16
`tl.dot` is not exact), no autotuning.
"""

from __future__ import annotations

import torch

from mini.attention.triton_utils import import_triton

triton, tl = import_triton()


@triton.jit
def _int4_matmul_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K, group_size,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        offs_k = k_start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)
        tile_mask = mask_k[:, None] & mask_n[None, :]
        packed = tl.load(qweight_ptr + (offs_k[:, None] // 8) * N + offs_n[None, :], mask=tile_mask, other=0)
        q = ((packed >> ((offs_k[:, None] % 8) * 4)) & 0xF).to(tl.float32)
        group = offs_k[:, None] // group_size
        scale = tl.load(scales_ptr + group * N + offs_n[None, :], mask=tile_mask, other=0.0)
        zero = tl.load(zeros_ptr + group * N + offs_n[None, :], mask=tile_mask, other=0.0)
        acc += tl.dot(x, (q - zero) * scale)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _int8_matmul_kernel(x_ptr, weight_ptr, scales_ptr, out_ptr, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        offs_k = k_start + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + offs_n[None, :] * K + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :],
                    other=0).to(tl.float32)
        acc += tl.dot(x, w)
    scale = tl.load(scales_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc * scale[None, :],
             mask=mask_m[:, None] & mask_n[None, :])


def _grid(m: int, n: int, block_m: int, block_n: int) -> tuple[int, int]:
    return (triton.cdiv(m, block_m), triton.cdiv(n, block_n))


def int4_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                block_m: int = 16, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """`x [M, K] @ W^T` -> float32 `[M, N]` for a GPTQ-packed W (`block_k` must divide `group_size`)."""
    m, k = x.shape
    n = qweight.shape[1]
    if group_size % block_k or k % 8:
        raise ValueError(f"block_k ({block_k}) must divide group_size ({group_size}) and 8 must divide K ({k})")
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    grid = _grid(m, n, block_m, block_n)
    _int4_matmul_kernel[grid](x.contiguous(), qweight.contiguous(), scales.float().contiguous(),
                              zeros.float().contiguous(), out, m, n, k, group_size,
                              BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                block_m: int = 16, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """`x [M, K] @ (weight * scales[:, None])^T` -> float32 `[M, N]`."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    _int8_matmul_kernel[_grid(m, n, block_m, block_n)](x.contiguous(), weight.contiguous(), scales.contiguous(), out,
                                                       m, n, k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
