"""The tensor-parallel process group of one worker process (mirrors vllm/distributed/parallel_state.py).

Each tensor-parallel worker (mini/executor/multiproc_executor.py) calls `init_worker_distributed_environment`
once, before it builds its model: that joins the default `torch.distributed` process group, gloo on the CPU
and NCCL on CUDA (one device per rank, `cuda:{rank}`), and records this rank and the group's size. The
parallel layers ask `get_tensor_model_parallel_rank()` / `get_tensor_model_parallel_world_size()` when
they are built, to know which shard of each weight to hold; the collectives in communication_op.py run on
the group.

Where mini differs: vLLM's `GroupCoordinator` manages one group per kind of parallelism (TP, PP, DP, EP,
...) inside a world made of all of them, plus a CPU group beside the device group and custom all-reduce
kernels; mini has tensor parallelism only, so its TP group IS the world, and it keeps the group in one
small module-level record. Not initialized (the default, every single-process engine) reads as rank 0 of
1, so the layers build their full weights and every collective is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# How long a collective or the rendezvous may wait for a missing rank before it raises (vLLM's default
# process-group timeout is torch's 10 min; a dead peer is normally noticed far sooner, by its closed socket).
DEFAULT_TIMEOUT = timedelta(minutes=5)


@dataclass(slots=True)
class _TensorParallelGroup:
    """This process's place in the tensor-parallel group (vLLM: `GroupCoordinator`, much reduced)."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    group: Any   # the torch.distributed ProcessGroup (the default, world group)


_TP: _TensorParallelGroup | None = None


def backend_for_device(device: str | torch.device) -> str:
    """gloo for the CPU, NCCL for CUDA (vLLM picks `current_platform.dist_backend` the same way)."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_distributed_environment(world_size: int, rank: int, init_method: str,
                                 device: str | torch.device = "cpu",
                                 timeout: timedelta = DEFAULT_TIMEOUT) -> None:
    """Join the world of `world_size` processes as `rank` through `init_method` (`file://...` or `tcp://...`).

    vLLM: `init_distributed_environment` + `initialize_model_parallel` (here the TP group is the world).
    On CUDA the caller has already picked this rank's device (`cuda:{rank}`).
    """
    global _TP
    if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank!r}, world_size={world_size!r}")
    if _TP is not None:
        if (_TP.rank, _TP.world_size) != (rank, world_size):
            raise RuntimeError(f"this process is already rank {_TP.rank} of {_TP.world_size}; "
                               f"cannot become rank {rank} of {world_size}")
        return
    backend = backend_for_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method=init_method, world_size=world_size, rank=rank,
                                timeout=timeout)
    _TP = _TensorParallelGroup(rank=rank, world_size=world_size, backend=backend, device=torch.device(device),
                               group=dist.group.WORLD)


def init_worker_distributed_environment(config: Any, rank: int, init_method: str) -> None:
    """What a worker process does before loading its shard (vLLM: `init_worker_distributed_environment` in
    vllm/v1/worker/gpu_worker.py): on CUDA select `cuda:{rank}`, then join the group of
    `config.tensor_parallel_size` ranks."""
    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed_environment(int(config.tensor_parallel_size), rank, init_method, device)


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> _TensorParallelGroup | None:
    """This process's tensor-parallel group, or None (a single-process engine)."""
    return _TP


def get_tensor_model_parallel_world_size() -> int:
    """How many ranks share each layer (1 when no group was initialized)."""
    return 1 if _TP is None else _TP.world_size


def get_tensor_model_parallel_rank() -> int:
    """This process's rank in the group (0 when no group was initialized)."""
    return 0 if _TP is None else _TP.rank


def destroy_distributed_environment() -> None:
    """Leave the group (vLLM: `destroy_model_parallel` + `destroy_distributed_environment`). Idempotent."""
    global _TP
    _TP = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
