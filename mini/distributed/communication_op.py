"""The collectives tensor parallelism needs (mirrors vllm/distributed/communication_op.py).

    tensor_model_parallel_all_reduce   every rank ends with the SUM of every rank's tensor
                                       (RowParallelLinear's partial products, VocabParallelEmbedding's rows)
    tensor_model_parallel_all_gather   every rank ends with all ranks' tensors concatenated along `dim`
                                       (ParallelLMHead's vocabulary slices of the logits)
    tensor_model_parallel_gather       the same, but only rank `dst` receives it (the others get None)

Each is a no-op returning its input when the group has one rank (or none was initialized), so a
single-process engine calls no torch.distributed function at all. vLLM routes them through its
`GroupCoordinator` (custom all-reduce kernels, a CPU group for small tensors); mini calls
`torch.distributed` on the one TP group directly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mini.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum `input_` over the ranks, in place; returns it (every rank gets the same sum)."""
    group = get_tp_group()
    if group is None or group.world_size == 1:
        return input_
    dist.all_reduce(input_, op=dist.ReduceOp.SUM, group=group.group)
    return input_


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `input_` (same shape on all ranks) along `dim`, in rank order, on every rank."""
    group = get_tp_group()
    if group is None or group.world_size == 1:
        return input_
    input_ = input_.contiguous()
    pieces = [torch.empty_like(input_) for _ in range(group.world_size)]
    dist.all_gather(pieces, input_, group=group.group)
    return torch.cat(pieces, dim=dim)


def tensor_model_parallel_gather(input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
    """Concatenate every rank's `input_` along `dim` on rank `dst` only; the other ranks get None."""
    group = get_tp_group()
    if group is None or group.world_size == 1:
        return input_
    input_ = input_.contiguous()
    pieces = [torch.empty_like(input_) for _ in range(group.world_size)] if group.rank == dst else None
    dist.gather(input_, gather_list=pieces, dst=dst, group=group.group)
    return torch.cat(pieces, dim=dim) if pieces is not None else None
