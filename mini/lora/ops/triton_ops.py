"""Triton LoRA kernels: shrink then expand, one program per (token, tile of the output), no adapter -> no work.

Mirrors vllm/lora/ops/triton_ops/lora_shrink_op.py and lora_expand_op.py. vLLM's kernels sort the tokens by
adapter (vllm/lora/ops/triton_ops/lora_kernel_metadata.py) and run a `tl.dot` tile per (adapter, block of
tokens); mini's are the simplest correct form, one token per program (a batched matrix-vector product, what
vLLM's older "bgmv" kernels were): each program reads its token's slot, returns at once for -1 (no adapter),
and otherwise reduces over K in `BLOCK_K` chunks with `tl.sum` (fp32 accumulate; no `tl.dot`, so Triton's
interpreter computes it exactly on the CPU, and no autotuning).
"""

from __future__ import annotations

import torch

from mini.attention.triton_utils import import_triton

try:   # the interpreter is switched on first where there is no GPU (mini/attention/triton_utils.py)
    triton, tl = import_triton()
except ImportError:  # pragma: no cover - the torch ops serve without triton
    triton = None


if triton is not None:
    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, out_ptr, slot_ptr, K, N,
                     stride_xt, stride_ws, stride_wn, stride_ot,
                     ACCUMULATE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[t, n] (+)= sum_k x[t, k] * w[slot[t], n, k] for the program's token t and tile of n."""
        token = tl.program_id(0)
        slot = tl.load(slot_ptr + token)
        if slot < 0:
            return
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + token * stride_xt + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + slot * stride_ws + offs_n[:, None] * stride_wn + offs_k[None, :],
                        mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
        out_ptrs = out_ptr + token * stride_ot + offs_n
        if ACCUMULATE:
            acc += tl.load(out_ptrs, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def _gemv(x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, token_slots: torch.Tensor,
          accumulate: bool, block_n: int, block_k: int) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("the triton LoRA kernels need the `triton` package")
    num_tokens, k = x.shape
    n = weights.shape[1]
    if weights.shape[2] != k or out.shape != (num_tokens, n) or token_slots.shape != (num_tokens,):
        raise ValueError(f"shapes do not fit: x {list(x.shape)}, weights {list(weights.shape)}, out "
                         f"{list(out.shape)}, token_slots {list(token_slots.shape)}")
    x, weights = x.contiguous(), weights.contiguous()
    grid = (num_tokens, triton.cdiv(n, block_n))
    _gemv_kernel[grid](x, weights, out, token_slots.to(torch.int32).contiguous(), k, n,
                       x.stride(0), weights.stride(0), weights.stride(1), out.stride(0),
                       ACCUMULATE=accumulate, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor, *, block_n: int = 16,
                block_k: int = 64) -> torch.Tensor:
    """`[T, in]` -> `[T, max_rank]` fp32: `x[t] @ lora_a[slot[t]].T`; zero rows for slot -1."""
    buffer = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    return _gemv(x, lora_a, buffer, token_slots, False, block_n, block_k)


def lora_expand(out: torch.Tensor, buffer: torch.Tensor, lora_b: torch.Tensor, token_slots: torch.Tensor, *,
                block_n: int = 64, block_k: int = 16) -> torch.Tensor:
    """`out[t] += buffer[t] @ lora_b[slot[t]].T` in place (rows with slot -1 untouched)."""
    if not out.is_contiguous():
        raise ValueError("lora_expand writes into `out` in place: it must be contiguous")
    return _gemv(buffer, lora_b, out, token_slots, True, block_n, block_k)


def add_lora(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
             token_slots: torch.Tensor) -> torch.Tensor:
    """Shrink then expand: `out[t] += B[s] @ (A[s] @ x[t])` for every token with a slot s >= 0."""
    return lora_expand(out, lora_shrink(x, lora_a, token_slots), lora_b, token_slots)
