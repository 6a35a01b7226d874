"""Build one step's flat model inputs from per-request state: the heart of phase 02.

Mirrors `GPUModelRunner._prepare_inputs` in vllm/v1/worker/gpu_model_runner.py (and the slot mapping
of vllm/v1/worker/block_table.py `compute_slot_mapping`). All requests' scheduled tokens are laid end to
end in ONE flat batch, no padding; a few small tensors say where each request starts and where each
token's K/V goes in the paged cache.

mini's choice: pure functions on the CPU, in PyTorch. vLLM v0.33.0 keeps persistent buffers, builds the
request indices, offsets and input ids on the CPU with NumPy, and computes positions, `seq_lens` and the
slot mapping on the GPU (the slot mapping with a Triton kernel, `ComputeSlotMappingKernel`, which also pads
the rest of its buffer with -1 for CUDA graphs). Same values.

These functions are parts of the `input_preparation` role (mini/roles.py), held by `ModelRunner`.
`prepare_inputs` and `assemble_inputs` take the four helpers they call as keyword arguments (the reference
ones by default), so a runner built with a replaced helper runs it inside the reference composition.

Worked example (block_size=4; three prompts; blocks [1,2], [3,4], [5]):

    token ids         [1,2,3,4,5]  [1,6,5,7,8,9,10]  [1,12,13]
    query_start_loc   [0, 5, 12, 15]          request i owns flat rows qsl[i]:qsl[i+1]
    positions         [0..4, 0..6, 0..2]      num_computed_tokens + 0, 1, 2, ...
    slot_mapping      [4..8, 12..18, 20..22]  block_table[req, pos // 4] * 4 + pos % 4
    seq_lens          [5, 7, 3]               num_computed_tokens + num_scheduled_tokens
    logits_indices    [4, 11, 14]             each request's last row: qsl[1:] - 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields

import torch


@dataclass(slots=True)
class PreparedInputs:
    """The tensors of one step (all on the CPU; the runner moves them to the device)."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    slot_mapping: torch.Tensor  # int64 [T]
    block_table: torch.Tensor  # int32 [B, max_num_blocks], 0-padded
    logits_indices: torch.Tensor  # int64 [B]

    def __getitem__(self, name: str) -> torch.Tensor:
        """Dict-style access too: `inputs["slot_mapping"]`."""
        if name not in self.keys():
            raise KeyError(f"{name!r}; PreparedInputs has {self.keys()}")
        return getattr(self, name)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def to(self, device: torch.device | str) -> PreparedInputs:
        return PreparedInputs(*(getattr(self, name).to(device) for name in self.keys()))


def compute_query_start_loc(num_scheduled_tokens: Sequence[int]) -> torch.Tensor:
    """int32 `[B + 1]`: 0, then the running total of scheduled tokens (a prefix sum)."""
    counts = torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int32)
    return torch.cat((torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)))


def compute_req_indices(num_scheduled_tokens: Sequence[int]) -> torch.Tensor:
    """int64 `[T]`: the request (batch row) each flat token belongs to, e.g. [2, 1] -> [0, 0, 1]."""
    scheduled = torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(scheduled)), scheduled)


def compute_positions(num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int]) -> torch.Tensor:
    """int64 `[T]`: request i contributes positions `num_computed[i] .. num_computed[i] + num_scheduled[i] - 1`."""
    computed = torch.as_tensor(list(num_computed_tokens), dtype=torch.int64)
    scheduled = torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int64)
    req_indices = compute_req_indices(num_scheduled_tokens)
    first_row = torch.cumsum(scheduled, 0) - scheduled  # flat row where each request starts
    offset_in_request = torch.arange(int(scheduled.sum())) - first_row[req_indices]
    return computed[req_indices] + offset_in_request


def compute_slot_mapping(
    block_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """int64 `[T]`: the cache slot of each token = its block's id * block_size + offset in the block.

    `block_table[i]` lists request i's physical blocks; `req_indices[t]` is the request of flat row t
    and `positions[t]` that token's position inside its request.
    """
    block_numbers = block_table[req_indices.long(), positions.long() // block_size].long()
    return block_numbers * block_size + positions.long() % block_size


def compute_logits_indices(query_start_loc: torch.Tensor) -> torch.Tensor:
    """int64 `[B]`: the flat row of each request's LAST scheduled token, `query_start_loc[1:] - 1`.

    Only these rows go through the LM head: the hidden state of a request's last new token predicts
    its next token; the other rows only filled the KV cache.
    """
    return query_start_loc[1:].long() - 1


def make_block_table(block_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """int32 `[B, max_num_blocks]`, each row right-padded with 0 (the null block)."""
    width = max((len(row) for row in block_ids), default=0) or 1
    padded = [list(ids) + [0] * (width - len(ids)) for ids in block_ids]
    return torch.tensor(padded, dtype=torch.int32).view(len(block_ids), width)


def prepare_inputs(
    token_ids: Sequence[Sequence[int]],
    num_computed_tokens: Sequence[int],
    num_scheduled_tokens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    *,
    compute_query_start_loc: Callable[..., torch.Tensor] = compute_query_start_loc,
    compute_positions: Callable[..., torch.Tensor] = compute_positions,
    compute_slot_mapping: Callable[..., torch.Tensor] = compute_slot_mapping,
    compute_logits_indices: Callable[..., torch.Tensor] = compute_logits_indices,
) -> PreparedInputs:
    """Per request (one entry per batch row): all its token ids so far, how many are already in the KV
    cache, how many to compute now, and its block ids -> the step's flat tensors."""
    _check_inputs(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size)
    input_ids = [
        token
        for tokens, start, count in zip(token_ids, num_computed_tokens, num_scheduled_tokens, strict=False)
        for token in tokens[start : start + count]
    ]
    return assemble_inputs(input_ids, num_computed_tokens, num_scheduled_tokens, make_block_table(block_ids),
                           block_size, compute_query_start_loc=compute_query_start_loc,
                           compute_positions=compute_positions, compute_slot_mapping=compute_slot_mapping,
                           compute_logits_indices=compute_logits_indices)


def assemble_inputs(input_ids: Sequence[int], num_computed_tokens: Sequence[int],
                    num_scheduled_tokens: Sequence[int], block_table: torch.Tensor, block_size: int,
                    *,
                    compute_query_start_loc: Callable[..., torch.Tensor] = compute_query_start_loc,
                    compute_positions: Callable[..., torch.Tensor] = compute_positions,
                    compute_slot_mapping: Callable[..., torch.Tensor] = compute_slot_mapping,
                    compute_logits_indices: Callable[..., torch.Tensor] = compute_logits_indices,
                    ) -> PreparedInputs:
    """The flat tensors from the flat token ids, per-request counts and a ready `[B, max_blocks]` block table
    (built from lists by `prepare_inputs`; the model runner passes its persistent one)."""
    query_start_loc = compute_query_start_loc(num_scheduled_tokens)
    positions = compute_positions(num_computed_tokens, num_scheduled_tokens)
    req_indices = compute_req_indices(num_scheduled_tokens)
    slot_mapping = compute_slot_mapping(block_table, req_indices, positions, block_size)
    seq_lens = torch.as_tensor(
        [start + count for start, count in zip(num_computed_tokens, num_scheduled_tokens,
                                               strict=False)], dtype=torch.int32
    )
    return PreparedInputs(
        input_ids=torch.as_tensor(input_ids, dtype=torch.int64),
        positions=positions,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        slot_mapping=slot_mapping,
        block_table=block_table,
        logits_indices=compute_logits_indices(query_start_loc),
    )


def _check_inputs(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    num_reqs = len(token_ids)
    for name, values in (("num_computed_tokens", num_computed_tokens),
                         ("num_scheduled_tokens", num_scheduled_tokens), ("block_ids", block_ids)):
        if len(values) != num_reqs:
            raise ValueError(f"{name} must have one entry per request ({num_reqs}), got {len(values)}")
    for req, (tokens, start, count, blocks) in enumerate(
        zip(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, strict=False)
    ):
        if start < 0 or count < 1 or start + count > len(tokens):
            raise ValueError(
                f"request {req}: need 0 <= num_computed_tokens and 1 <= num_scheduled_tokens with their sum "
                f"<= len(token_ids) ({len(tokens)}), got {start} and {count}"
            )
        if len(blocks) * block_size < start + count:
            raise ValueError(
                f"request {req}: block_ids {list(blocks)} hold {len(blocks) * block_size} slots, "
                f"fewer than the {start + count} tokens it will have"
            )
