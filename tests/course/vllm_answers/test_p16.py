"""vLLM v0.33.0's own LoRA code passes phase 16's (16_lora) checks.

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape:

* the token mapping: the model runner repeats each request's adapter id once per scheduled token
  (`InputBatch.make_lora_inputs`, vllm/v1/worker/gpu_input_batch.py, a numpy `repeat`), then
  `convert_mapping` (vllm/lora/punica_wrapper/utils.py) turns the ids into slots; its `base_indices` is
  `compute_token_lora_indices`. `async_tensor_h2d` (vllm/utils/torch_utils.py) is compiled beside it;
* the shrink: `bgmv_shrink` (vllm/lora/ops/torch_ops/lora_ops.py) writes into a buffer it is given, so the adapter
  hands it a zero one and returns it; `sgmv_shrink`, the per-request ("segmented") form, passes too, given the
  run of equal indices as one segment each;
* the expand: `bgmv_expand_slice` (same file) with `slice_size = lora_b.shape[1]` and `add_inputs=True`, and
  `sgmv_expand_slice` the same way.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy
import torch

from tests.course.fidelity import check_of, vllm_definition

PHASE = "16_lora"
LORA_OPS = "vllm/lora/ops/torch_ops/lora_ops.py"


def _ops(*names: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"torch": torch}
    for name in names:
        vllm_definition(LORA_OPS, name, namespace)
    return namespace


def _segments(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of equal indices as segments: (one index per segment, its length), what the sgmv ops take."""
    values, counts = torch.unique_consecutive(indices, return_counts=True)
    return values, counts


def test_vllm_convert_mapping_passes_as_compute_token_lora_indices():
    namespace: dict[str, Any] = {"torch": torch, "np": numpy, "PIN_MEMORY": False}
    vllm_definition("vllm/utils/torch_utils.py", "async_tensor_h2d", namespace)
    convert_mapping = vllm_definition("vllm/lora/punica_wrapper/utils.py", "convert_mapping", namespace)

    def compute_token_lora_indices(req_lora_ids, num_scheduled_tokens, lora_index_to_id):
        token_lora_mapping = tuple(int(i) for i in numpy.asarray(req_lora_ids).repeat(numpy.asarray(
            num_scheduled_tokens)))                                  # make_lora_inputs
        mapping = SimpleNamespace(index_mapping=token_lora_mapping, prompt_mapping=token_lora_mapping)
        base_indices = convert_mapping(mapping, lora_index_to_id, max(1, len(lora_index_to_id)), 8, "cpu")[0]
        return base_indices.to(torch.int64)

    check_of(PHASE, "compute_token_lora_indices")(compute_token_lora_indices)


def test_vllm_bgmv_shrink_passes_as_lora_shrink():
    bgmv_shrink = _ops("bgmv_shrink")["bgmv_shrink"]

    def lora_shrink(x, lora_a, token_lora_indices, scaling):
        buffer = torch.zeros(x.shape[0], lora_a.shape[1], dtype=x.dtype)
        bgmv_shrink(x, lora_a, buffer, token_lora_indices, scaling)
        return buffer

    check_of(PHASE, "lora_shrink")(lora_shrink)


def test_vllm_sgmv_shrink_passes_as_lora_shrink():
    sgmv_shrink = _ops("bgmv_shrink", "sgmv_shrink")["sgmv_shrink"]

    def lora_shrink(x, lora_a, token_lora_indices, scaling):
        buffer = torch.zeros(x.shape[0], lora_a.shape[1], dtype=x.dtype)
        indices, lengths = _segments(token_lora_indices)
        starts = torch.cumsum(lengths, 0) - lengths
        sgmv_shrink(x, lora_a, buffer, starts, lengths, indices, len(indices), int(lengths.max()), x.shape[0],
                    scaling)
        return buffer

    check_of(PHASE, "lora_shrink")(lora_shrink)


def test_vllm_bgmv_expand_slice_passes_as_lora_expand():
    bgmv_expand_slice = _ops("bgmv_expand_slice")["bgmv_expand_slice"]

    def lora_expand(out, buffer, lora_b, token_lora_indices, slice_offset):
        bgmv_expand_slice(buffer, lora_b, out, token_lora_indices, slice_offset, lora_b.shape[1], add_inputs=True)
        return out

    check_of(PHASE, "lora_expand")(lora_expand)


def test_vllm_sgmv_expand_slice_passes_as_lora_expand():
    sgmv_expand_slice = _ops("bgmv_expand_slice", "sgmv_expand_slice")["sgmv_expand_slice"]

    def lora_expand(out, buffer, lora_b, token_lora_indices, slice_offset):
        indices, lengths = _segments(token_lora_indices)
        starts = torch.cumsum(lengths, 0) - lengths
        sgmv_expand_slice(buffer, lora_b, out, starts, lengths, indices, len(indices), int(lengths.max()),
                          out.shape[0], slice_offset, lora_b.shape[1], add_inputs=True)
        return out

    check_of(PHASE, "lora_expand")(lora_expand)
