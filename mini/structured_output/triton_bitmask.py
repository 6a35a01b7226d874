"""The bitmask as a Triton kernel (CUDA; the CPU interpreter under TRITON_INTERPRET=1 in tests).

Mirrors xgrammar's `apply_token_bitmask_inplace_triton` (xgrammar/kernels/apply_token_bitmask_inplace_triton.py),
which vllm/v1/structured_output/utils.py `apply_grammar_bitmask` calls on GPUs. One program per
(masked row, block of `BLOCK` tokens): load the row's int32 words that cover the block, test bit
`t % 32` of word `t // 32`, and write -inf over the disallowed logits, in place. Same result as the
torch op in bitmask.py, which the engine uses on CPU tensors.
"""

from __future__ import annotations

import torch

from mini.attention.triton_utils import import_triton

triton, tl = import_triton()

BLOCK = 1024


@triton.jit
def _apply_token_bitmask_kernel(logits_ptr, bitmask_ptr, indices_ptr, vocab_size, num_words, logits_stride,
                                bitmask_stride, BLOCK: tl.constexpr):
    mask_row = tl.program_id(0)
    block = tl.program_id(1)
    logits_row = tl.load(indices_ptr + mask_row)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offsets < vocab_size
    word_index = offsets // 32
    words = tl.load(bitmask_ptr + mask_row * bitmask_stride + word_index,
                    mask=in_vocab & (word_index < num_words), other=0)
    allowed = ((words >> (offsets % 32)) & 1) != 0
    tl.store(logits_ptr + logits_row * logits_stride + offsets, float("-inf"), mask=in_vocab & (allowed == 0))


def apply_token_bitmask_inplace_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                                       indices: torch.Tensor | None = None) -> torch.Tensor:
    """Set disallowed logits to -inf in rows `indices` (all rows if None), in place; returns logits."""
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [num_rows, ceil(vocab/32)], got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be a [num_rows, vocab] tensor with contiguous rows, got {tuple(logits.shape)}")
    if indices is None:
        indices = torch.arange(logits.shape[0], device=logits.device)
    indices = indices.to(device=logits.device, dtype=torch.int32)
    if indices.numel() != bitmask.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {indices.numel()} indices")
    if indices.numel() == 0:
        return logits
    bitmask = bitmask.to(logits.device).contiguous()
    vocab_size = logits.shape[1]
    grid = (indices.numel(), triton.cdiv(vocab_size, BLOCK))
    _apply_token_bitmask_kernel[grid](logits, bitmask, indices, vocab_size, bitmask.shape[1], logits.stride(0),
                                      bitmask.stride(0), BLOCK=BLOCK)
    return logits
