"""Linear layers split across tensor-parallel ranks (mirrors vllm/model_executor/layers/linear.py).

A linear layer `y = x W^T + b` with `W` of shape `[out, in]` can be cut two ways:

    ColumnParallelLinear   W cut by OUTPUT rows: rank r holds rows [r*out/N, (r+1)*out/N) and computes
                           that slice of y from the full x; no communication (the slices stay apart).
    RowParallelLinear      W cut by INPUT columns: rank r holds columns [r*in/N, ...) and multiplies them
                           with ITS slice of x (what a column-parallel layer left it); the N partial
                           products are summed with an all-reduce, and the bias is added once.

A Llama layer pairs them so each half costs one all-reduce: q/k/v are column-parallel (each rank gets whole
attention heads), o_proj row-parallel (all-reduce); gate/up column-parallel, down_proj row-parallel
(all-reduce). `QKVParallelLinear` and `MergedColumnParallelLinear` are column-parallel layers holding
several projections in one matrix (vLLM's `qkv_proj`, `gate_up_proj`): each rank's matrix is ITS slices of
each projection, stacked.

Loading follows vLLM's design: every parameter's layer has a `weight_loader(param, loaded_weight[, shard_id])`
that receives the FULL checkpoint tensor and copies this rank's shard into `param`, so the checkpoint on disk
is the same whatever the number of ranks (mini/model/loader.py calls it).

Where mini differs: mini's Llama keeps the Hugging Face layout (separate `q_proj`, `k_proj`, `v_proj`,
`gate_proj`, `up_proj`, loaded name for name and greedy-identical to transformers), so the model uses
`ColumnParallelLinear` for each of them; the fused `QKVParallelLinear` / `MergedColumnParallelLinear` are
here as vLLM has them, tested, for the course. No input splitting (`input_is_parallel` is always true), no
`skip_bias_add`.

Quantization (as vLLM's `LinearMethodBase`): every layer multiplies through `self.quant_method.apply(self, x,
bias)`. `UnquantizedLinearMethod` is `F.linear` on the float `weight`; a scheme of mini/model/quantization/ swaps
in its own method, which holds packed weights instead (`attach_quant_methods` in mini/model/loader.py; one rank
only).

With one rank each layer IS an `nn.Linear` of the full size and runs `nn.Linear.forward`: no collective,
no extra copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from mini.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from mini.model.quantization.base_config import QuantizeMethodBase


class LinearMethodBase(QuantizeMethodBase):
    """A linear layer's method: `apply(layer, x, bias)` is its `x W^T + b` (vLLM: linear.py's LinearMethodBase)."""


class UnquantizedLinearMethod(LinearMethodBase):
    """The float weight the layer was built with, multiplied by `F.linear`."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


UNQUANTIZED = UnquantizedLinearMethod()


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """`numerator / denominator`, refusing a remainder (vLLM: `vllm.distributed.utils.divide`)."""
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) must be divisible by tensor parallel size ({denominator})")
    return numerator // denominator


def resolve_tp_rank_and_size(tp_rank: int | None, tp_size: int | None) -> tuple[int, int]:
    """Explicit values (tests, the course, KV-head replication) or this process's group (the default)."""
    size = get_tensor_model_parallel_world_size() if tp_size is None else int(tp_size)
    rank = get_tensor_model_parallel_rank() if tp_rank is None else int(tp_rank)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tp_rank must be in [0, tp_size); got tp_rank={rank}, tp_size={size}")
    return rank, size


@dataclass(frozen=True, slots=True)
class KVHeadPartition:
    """Which KV heads one rank holds (vLLM: `num_kv_heads`, `num_kv_head_replicas` in `QKVParallelLinear`).

    With at least as many KV heads as ranks, each rank holds `total / tp_size` of them. With fewer, vLLM
    REPLICATES them: each rank holds one KV head, the same one as `replicas - 1` other ranks (rank r holds
    head `r // replicas`), which is exactly the head its query heads attend to under grouped-query attention.
    """

    num_kv_heads: int      # KV heads on this rank
    replicas: int          # how many ranks hold each KV head (1: no replication)
    shard_rank: int        # which shard of the checkpoint's K/V rows this rank takes
    num_shards: int        # how many distinct shards there are (tp_size / replicas)


def kv_head_partition(total_num_kv_heads: int, tp_size: int, tp_rank: int) -> KVHeadPartition:
    """The KV heads of rank `tp_rank` of `tp_size`, replicated when there are fewer heads than ranks."""
    if tp_size >= total_num_kv_heads:
        replicas = divide(tp_size, total_num_kv_heads, "tensor parallel size")
        return KVHeadPartition(1, replicas, tp_rank // replicas, tp_size // replicas)
    return KVHeadPartition(divide(total_num_kv_heads, tp_size, "number of KV heads"), 1, tp_rank, tp_size)


def _load_rows(param: torch.Tensor, loaded_weight: torch.Tensor, shard_rank: int, dim: int = 0) -> None:
    """Copy slice `shard_rank` (of size `param.shape[dim]`) of the full `loaded_weight` along `dim` into `param`."""
    size = param.shape[dim]
    if loaded_weight.dim() != param.dim() or loaded_weight.shape[dim] < (shard_rank + 1) * size:
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded_weight.shape)} has no shard {shard_rank} of "
                         f"{size} along dim {dim} for a parameter of shape {tuple(param.shape)}")
    shard = loaded_weight.narrow(dim, shard_rank * size, size)
    if shard.shape != param.shape:
        raise ValueError(f"checkpoint shard of shape {tuple(shard.shape)} does not fit a parameter of shape "
                         f"{tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(shard)


class ColumnParallelLinear(nn.Linear):
    """`nn.Linear(input_size, output_size)` with its OUTPUT rows split over the ranks (weight and bias).

    `forward(x)` -> this rank's `[..., output_size / tp_size]` slice of y (`gather_output=True`: all of y,
    gathered from every rank). `tp_rank` / `tp_size` default to this process's tensor-parallel group.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False, *,
                 tp_rank: int | None = None, tp_size: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        self.tp_rank, self.tp_size = resolve_tp_rank_and_size(tp_rank, tp_size)
        self.input_size, self.output_size = int(input_size), int(output_size)
        self.output_size_per_partition = divide(self.output_size, self.tp_size, "output size")
        self.gather_output = bool(gather_output)
        super().__init__(self.input_size, self.output_size_per_partition, bias=bias, device=device, dtype=dtype)

    quant_method: QuantizeMethodBase = UNQUANTIZED

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.quant_method.apply(self, x, self.bias)
        if self.gather_output and self.tp_size > 1:
            output = tensor_model_parallel_all_gather(output, dim=-1)
        return output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Full `[output_size, input_size]` weight (or `[output_size]` bias) -> this rank's rows."""
        _load_rows(param, loaded_weight, self.tp_rank, dim=0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tp_rank={self.tp_rank}, tp_size={self.tp_size}"


class RowParallelLinear(nn.Linear):
    """`nn.Linear(input_size, output_size)` with its INPUT columns split over the ranks.

    `forward(x_r)` takes this rank's `[..., input_size / tp_size]` slice of the input (a column-parallel
    layer's output) and returns the FULL `[..., output_size]`: local matmul, all-reduce of the partial sums,
    the bias added once (by rank 0 before the sum, as vLLM). Every rank holds the full bias.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = True, reduce_results: bool = True, *,
                 tp_rank: int | None = None, tp_size: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        self.tp_rank, self.tp_size = resolve_tp_rank_and_size(tp_rank, tp_size)
        self.input_size, self.output_size = int(input_size), int(output_size)
        self.input_size_per_partition = divide(self.input_size, self.tp_size, "input size")
        self.reduce_results = bool(reduce_results)
        super().__init__(self.input_size_per_partition, self.output_size, bias=bias, device=device, dtype=dtype)

    quant_method: QuantizeMethodBase = UNQUANTIZED

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(output) if self.reduce_results else output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Full `[output_size, input_size]` weight -> this rank's columns; the bias is copied whole."""
        if param.dim() == 1:
            _load_rows(param, loaded_weight, 0, dim=0)
        else:
            _load_rows(param, loaded_weight, self.tp_rank, dim=1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tp_rank={self.tp_rank}, tp_size={self.tp_size}"


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matrix (vLLM: gate_up_proj).

    `output_sizes=[inner, inner]` holds gate and up: this rank's matrix is [its gate rows; its up rows], so
    `forward(x).split(layer.output_sizes_per_partition, -1)` gives this rank's slice of each. The checkpoint's
    separate tensors are loaded with `weight_loader(param, full_tensor, shard_id)`, shard_id = 0, 1, ...
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True, gather_output: bool = False,
                 **kwargs) -> None:
        self.output_sizes = [int(size) for size in output_sizes]
        super().__init__(input_size, sum(self.output_sizes), bias=bias, gather_output=gather_output, **kwargs)
        self.output_sizes_per_partition = [divide(size, self.tp_size, "output size") for size in self.output_sizes]

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,  # type: ignore[override]
                      shard_id: int | None = None) -> None:
        if shard_id is None:   # the whole merged matrix at once: shard each projection's rows in turn
            for index, piece in enumerate(loaded_weight.split(self.output_sizes, dim=0)):
                self.weight_loader(param, piece, index)
            return
        offset = sum(self.output_sizes_per_partition[:shard_id])
        _load_rows(param.data.narrow(0, offset, self.output_sizes_per_partition[shard_id]), loaded_weight,
                   self.tp_rank, dim=0)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v in one column-parallel matrix, split by attention HEADS (vLLM: qkv_proj).

    Rank r holds its `total_num_heads / tp_size` query heads and its KV heads (replicated when there are
    fewer KV heads than ranks: `kv_head_partition`), stacked [q; k; v]. `forward(x).split(layer.split_sizes,
    -1)` gives this rank's q, k, v. Load with `weight_loader(param, full_q_proj_tensor, "q")`, then "k", "v".
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int | None = None,
                 bias: bool = True, *, tp_rank: int | None = None, tp_size: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        rank, size = resolve_tp_rank_and_size(tp_rank, tp_size)
        self.head_size = int(head_size)
        self.total_num_heads = int(total_num_heads)
        self.total_num_kv_heads = int(total_num_kv_heads or total_num_heads)
        self.num_heads = divide(self.total_num_heads, size, "total number of attention heads")
        self.kv_partition = kv_head_partition(self.total_num_kv_heads, size, rank)
        self.num_kv_heads = self.kv_partition.num_kv_heads
        per_rank = (self.num_heads + 2 * self.num_kv_heads) * self.head_size
        super().__init__(hidden_size, per_rank * size, bias=bias, tp_rank=rank, tp_size=size, device=device,
                         dtype=dtype)
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        self.split_sizes = [q_size, kv_size, kv_size]

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,  # type: ignore[override]
                      shard_id: str | None = None) -> None:
        if shard_id not in ("q", "k", "v"):
            raise ValueError(f"shard_id must be one of 'q', 'k', 'v', got {shard_id!r}")
        q_size, kv_size, _ = self.split_sizes
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        shard_rank = self.tp_rank if shard_id == "q" else self.kv_partition.shard_rank
        _load_rows(param.data.narrow(0, offset, size), loaded_weight, shard_rank, dim=0)


__all__ = ["ColumnParallelLinear", "KVHeadPartition", "LinearMethodBase", "MergedColumnParallelLinear",
           "QKVParallelLinear", "RowParallelLinear", "UnquantizedLinearMethod", "divide", "kv_head_partition"]
