"""The attention layers' view of one step: `AttentionMetadata`, and its single builder.

Mirrors vllm/v1/attention/backend.py (`CommonAttentionMetadata`, the per-step tensors every backend reads)
and the metadata builders of vllm/v1/attention/backends/ (`build` turns the runner's flat batch into what
a layer needs). mini has one metadata type for every backend and one builder, used by the model runner,
the drafters, the start-up profiling run and the CUDA-graph capture alike. `AttentionBackend` is the base
of the backend classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Everything the attention layers need to find each request's tokens in the paged cache."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # int32 [B + 1]: where request i's query rows start in the flat batch
    seq_lens: torch.Tensor  # int32 [B]: tokens in the cache for request i after this step (context + new)
    block_table: torch.Tensor  # int32 [B, max_num_blocks]: physical block ids, padded with 0 (null block)
    slot_mapping: torch.Tensor  # int64 [T]: cache slot of each new token, -1 = padding (not stored)
    max_query_len: int
    max_seq_len: int


class FlatBatch(Protocol):
    """The flat tensors of one step the builder reads (mini.worker.prepare_inputs.PreparedInputs has them)."""

    input_ids: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


def build_attention_metadata(inputs: FlatBatch, *, max_query_len: int | None = None,
                             max_seq_len: int | None = None) -> AttentionMetadata:
    """The attention layers' view of the step's flat tensors (same tensors, plus two maxima).

    The maxima are read from the tensors unless given: a CUDA graph freezes upper bounds at capture
    (a device value cannot be read into Python while capturing).
    """
    if max_query_len is None:
        max_query_len = int((inputs.query_start_loc[1:] - inputs.query_start_loc[:-1]).max())
    if max_seq_len is None:
        max_seq_len = int(inputs.seq_lens.max())
    return AttentionMetadata(
        num_actual_tokens=int(inputs.input_ids.shape[0]),
        query_start_loc=inputs.query_start_loc,
        seq_lens=inputs.seq_lens,
        block_table=inputs.block_table,
        slot_mapping=inputs.slot_mapping,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )


__all__ = ["AttentionMetadata", "FlatBatch", "build_attention_metadata"]


class AttentionBackend:
    """What every backend class shares (vLLM: `AttentionBackend` in vllm/v1/attention/backend.py).

    A backend holds its parts as class attributes (mini/roles.py); `roles.resolve(config, backend)` is the
    class an engine builds: the backend itself, or, with some parts replaced, the role's reference class for
    it (for the CPU fast path, the reference backend) holding them.
    """

    name: ClassVar[str] = ""

