"""Apply a packed token bitmask to logits: disallowed tokens get -inf.

Mirrors vllm/v1/structured_output/utils.py (`apply_grammar_bitmask`, which the model runner calls on the
logits before sampling) and the op it calls, xgrammar's `apply_token_bitmask_inplace` (a CUDA/Triton
kernel there; a torch op here, which runs on CPU and CUDA alike; a `BitmaskApplier` on a CUDA device
runs the Triton kernel of triton_bitmask.py instead). Layout: `bitmask[i]` is `ceil(vocab / 32)` int32
words for logits row `indices[i]`; token t is allowed iff bit `t % 32` of word `t // 32` is 1. Rows not
in `indices` are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from mini.attention import triton_utils

if TYPE_CHECKING:
    from mini.structured_output import GrammarOutput


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [n, W] -> bool [n, vocab_size], True = allowed (tokens past 32 * W are not allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    if bits.shape[1] < vocab_size:
        bits = torch.nn.functional.pad(bits, (0, vocab_size - bits.shape[1]), value=False)
    return bits[:, :vocab_size]


def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor,
                                indices: torch.Tensor | None = None) -> torch.Tensor:
    """Set logits of disallowed tokens to -inf in the rows `indices` (all rows if None); returns logits."""
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [num_rows, ceil(vocab/32)], got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
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


def _triton_op() -> Callable[..., torch.Tensor]:
    """The Triton kernel's launcher (imported here: importing it imports triton, an optional dependency)."""
    from mini.structured_output.triton_bitmask import apply_token_bitmask_inplace_triton

    return apply_token_bitmask_inplace_triton


class BitmaskApplier:
    """Masks the constrained rows of a step's logits with the grammar bitmask, before sampling.

    vLLM's model runner calls `apply_grammar_bitmask` (vllm/v1/structured_output/utils.py) on the logits
    and then samples; mini's runner builds one applier and calls it the same way. Home of the
    `structured_output` role's `apply_token_bitmask_inplace` (mini/roles.py). On a CUDA device this fast
    class runs the Triton kernel (triton_bitmask.py, as xgrammar's on GPUs), decided once here; elsewhere the
    torch op. An engine that replaces the op builds `TorchBitmaskApplier`, the role's reference class.
    """

    apply_token_bitmask_inplace = staticmethod(apply_token_bitmask_inplace)

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.op: Callable[..., torch.Tensor] = self.apply_token_bitmask_inplace
        if self.device.type == "cuda" and triton_utils.is_available():
            self.op = _triton_op()

    def __call__(self, logits: torch.Tensor, grammar_output: GrammarOutput,
                 req_id_to_index: Mapping[str, int]) -> torch.Tensor:
        """-inf for the disallowed tokens of each constrained request's row (`req_id_to_index`: the batch
        row of each request, one logits row per request); returns `logits`, edited in place."""
        rows = [req_id_to_index[req_id] for req_id in grammar_output.structured_output_request_ids]
        bitmask = torch.from_numpy(grammar_output.grammar_bitmask).to(self.device)
        indices = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return self.op(logits, bitmask, indices)


class TorchBitmaskApplier(BitmaskApplier):
    """The reference applier: always `self.apply_token_bitmask_inplace`, on every device (the class an engine
    builds when that part is replaced, mini/roles.py)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.op = self.apply_token_bitmask_inplace
