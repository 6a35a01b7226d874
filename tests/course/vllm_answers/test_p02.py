"""vLLM v0.33.0's own code for phase 02 passes phase 02's checks (its call shape adapted, nothing else).

* `compute_positions`: `GPUModelRunner._get_cumsum_and_arange` (vllm/v1/worker/gpu_model_runner.py), with the
  two NumPy lines of `_prepare_inputs` around it that turn its per-request arange into positions
  (`req_indices = np.repeat(arange, num_scheduled)`, then `num_computed[req_indices] + query_pos`).
* `compute_slot_mapping`: vLLM computes the slot mapping on the GPU with a Triton kernel,
  `ComputeSlotMappingKernel.kernel` (vllm/v1/worker/block_table.py): one program per request walks its rows of
  `query_start_loc`; the last program pads the rest of the buffer with -1. It runs here under Triton's CPU
  interpreter (skipped without Triton), with no context parallelism (world size 1, rank 0).
* `compute_query_start_loc` and `prepare_inputs`' input-id gather are inline code in `_prepare_inputs`, with
  no function of their own to run.
"""

from types import SimpleNamespace

import numpy as np
import torch

from tests.course.fidelity import check_of, vllm_definition
from tests.course.vllm_kernels import vllm_kernel

PHASE = "02_slot_mapping"


def vllm_compute_positions():
    get_cumsum_and_arange = vllm_definition(
        "vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._get_cumsum_and_arange", {"np": np})
    runner = SimpleNamespace(arange_np=np.arange(100_000, dtype=np.int64))

    def compute_positions(num_computed_tokens, num_scheduled_tokens):
        num_scheduled = np.asarray(num_scheduled_tokens, dtype=np.int32)
        query_pos = np.zeros(100_000, dtype=np.int64)
        req_indices = np.repeat(runner.arange_np[: len(num_scheduled)], num_scheduled)
        cu_num_tokens = get_cumsum_and_arange(runner, num_scheduled, query_pos)
        positions = np.asarray(num_computed_tokens, dtype=np.int64)[req_indices] + query_pos[: cu_num_tokens[-1]]
        return torch.from_numpy(positions)

    return compute_positions


def test_vllm_positions_pass_check_positions():
    check_of(PHASE, "compute_positions")(vllm_compute_positions())


def vllm_compute_slot_mapping():
    kernel = vllm_kernel("vllm/v1/worker/block_table.py", "ComputeSlotMappingKernel.kernel")

    def compute_slot_mapping(block_table, req_indices, positions, block_size):
        num_reqs = block_table.shape[0]
        counts = torch.bincount(req_indices.long(), minlength=num_reqs)
        query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
        num_tokens = positions.shape[0]
        slot_mapping = torch.empty(num_tokens, dtype=torch.int64)
        block_table = block_table.contiguous()
        kernel[(num_reqs + 1,)](
            num_tokens, num_tokens, query_start_loc, positions.long().contiguous(), block_table,
            block_table.stride(0), slot_mapping, KV_CACHE_BLOCK_SIZE=block_size, TOTAL_CP_WORLD_SIZE=1,
            TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024)
        return slot_mapping

    return compute_slot_mapping


def test_vllm_slot_mapping_kernel_passes_check_slot_mapping():
    check_of(PHASE, "compute_slot_mapping")(vllm_compute_slot_mapping())
