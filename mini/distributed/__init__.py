"""torch.distributed for tensor parallelism (mirrors vllm/distributed/).

`parallel_state` starts and tears down the process group and answers "which rank am I, of how many";
`communication_op` holds the collectives the parallel layers (mini/model/parallel_linear.py,
mini/model/vocab_parallel_embedding.py) call. Without tensor parallelism nothing here is initialized and
every collective is a no-op returning its input.
"""

from mini.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)
from mini.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    init_distributed_environment,
    init_worker_distributed_environment,
    model_parallel_is_initialized,
)

__all__ = [
    "destroy_distributed_environment",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "init_distributed_environment",
    "init_worker_distributed_environment",
    "model_parallel_is_initialized",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
    "tensor_model_parallel_gather",
]
