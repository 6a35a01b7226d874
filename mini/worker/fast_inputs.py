"""The model runner's fast input path: one step's flat inputs from the persistent batch, in NumPy.

Mirrors `GPUModelRunner._prepare_inputs` in vllm/v1/worker/gpu_model_runner.py: vLLM computes the request
index of every flat token (`np.repeat`), the positions (`num_computed_tokens_cpu[req_indices] + arange`), the
input ids with one gather over its persistent `token_ids_cpu` buffer at `req_index * width + position`, and the
query start locations with NumPy on the host. mini does the same, and the slot mapping too (vLLM computes that
on the GPU with a Triton kernel). Same values as phase 02's `prepare_inputs` (mini/worker/prepare_inputs.py, the
course's reference path, which the runner runs when a part of the input composition is replaced): the tests
hold the two equal (tests/worker/test_runner_inputs.py, tests/worker/test_runner_token_ids_buffer.py).

Why NumPy: each small torch call costs microseconds of dispatch, about the cost of the arithmetic on a
decode batch; NumPy's are several times cheaper at these sizes, and `torch.from_numpy` shares the memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mini.worker.prepare_inputs import PreparedInputs
from mini.worker.token_ids_buffer import TokenIdsBuffer


def gather_inputs(token_ids: TokenIdsBuffer, num_computed_tokens: Sequence[int],
                  num_scheduled_tokens: Sequence[int], block_table: torch.Tensor, block_size: int
                  ) -> PreparedInputs:
    """The flat tensors of rows 0..B-1 (their tokens and blocks already synced into the persistent buffers).

    `block_table` is the persistent table cut to `[B, max_blocks]` (`BlockTable.get`)."""
    scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64)
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    cu_num_tokens = np.cumsum(scheduled)
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    req_indices = np.repeat(np.arange(len(scheduled)), scheduled)
    offsets = np.arange(total) - np.repeat(cu_num_tokens - scheduled, scheduled)
    positions = computed[req_indices] + offsets
    block_numbers = block_table.numpy()[req_indices, positions // block_size].astype(np.int64)
    query_start_loc = np.zeros(len(scheduled) + 1, dtype=np.int32)
    query_start_loc[1:] = cu_num_tokens
    return PreparedInputs(
        input_ids=torch.from_numpy(token_ids.gather(req_indices, positions)),
        positions=torch.from_numpy(positions),
        query_start_loc=torch.from_numpy(query_start_loc),
        seq_lens=torch.from_numpy((computed + scheduled).astype(np.int32)),
        slot_mapping=torch.from_numpy(block_numbers * block_size + positions % block_size),
        block_table=block_table,
        logits_indices=torch.from_numpy(cu_num_tokens - 1),
    )
