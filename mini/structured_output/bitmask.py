"""Apply a packed token bitmask to logits: disallowed tokens get -inf.

Mirrors vllm/v1/structured_output/utils.py (`apply_grammar_bitmask`) and the op it calls,
xgrammar's `apply_token_bitmask_inplace` (a CUDA/Triton kernel there; a torch op here, which runs on
CPU and CUDA alike; on CUDA tensors the Triton kernel in triton_bitmask.py runs instead). Layout: `bitmask[i]` is `ceil(vocab / 32)` int32 words for logits row `indices[i]`;
token t is allowed iff bit `t % 32` of word `t // 32` is 1. Rows not in `indices` are untouched.
"""

from __future__ import annotations

import torch

from mini.seams import seam


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [n, W] -> bool [n, vocab_size], True = allowed (tokens past 32 * W are not allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if bits.shape[1] < vocab_size:
        bits = torch.nn.functional.pad(bits, (0, vocab_size - bits.shape[1]), value=False)
    return bits[:, :vocab_size]


@seam("apply_token_bitmask_inplace")
def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor,
                                indices: torch.Tensor | None = None) -> torch.Tensor:
    """Set logits of disallowed tokens to -inf in the rows `indices` (all rows if None); returns logits."""
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [num_rows, ceil(vocab/32)], got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
    if logits.is_cuda:  # the same result from a Triton kernel, as vLLM/xgrammar on GPUs
        from mini.attention.triton_utils import is_available

        if is_available():
            from mini.structured_output.triton_bitmask import apply_token_bitmask_inplace_triton

            return apply_token_bitmask_inplace_triton(logits, bitmask, indices)
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[1])
    if indices is None:
        if allowed.shape[0] != logits.shape[0]:
            raise ValueError(f"bitmask has {allowed.shape[0]} rows for {logits.shape[0]} logits rows")
        return logits.masked_fill_(~allowed, float("-inf"))
    indices = indices.to(logits.device, torch.int64)
    if indices.numel() == logits.shape[0] and torch.equal(indices, torch.arange(logits.shape[0], device=logits.device)):
        return logits.masked_fill_(~allowed, float("-inf"))  # every row constrained: no gather/scatter
    logits[indices] = logits[indices].masked_fill(~allowed, float("-inf"))
    return logits
