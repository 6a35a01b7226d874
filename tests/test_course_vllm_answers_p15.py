"""vLLM v0.33.0's own implementations of phase 15's mirrored functions pass phase 15's checks (issue 27).

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape:
`RowParallelLinear.forward` (vllm/model_executor/layers/linear.py) runs as a method of mini's layer, with the
attributes vLLM's layer has (`input_is_parallel`, `skip_bias_add`, `return_bias`) and an unquantized
`quant_method` whose `apply` is `F.linear`; `VocabParallelEmbedding.forward` (vocab_parallel_embedding.py, with
vLLM's `get_masked_input_and_mask`) likewise, its `shard_indices` read from mini's range (no padding ids and
no added vocabulary: the added range is empty) and the unfused lookup path; `DPLBAsyncMPClient.
get_core_engine_for_request` (vllm/v1/engine/core_client.py) runs on a client stub holding the counts
(copies: vLLM's method bumps the chosen core's waiting count itself, mini's function leaves that to the
balancer; vLLM's always hold `[waiting, running, kv_cache_usage]`, so a pair gets usage 0) and a request
with no explicit rank, and returns the chosen core's index.

Not adapted: `QKVParallelLinear.weight_loader` (vLLM's dispatches on parameter attributes set by its
quantization methods: `output_dim`, `packed_dim`, `is_metadata`, ...; running it would mean rebuilding that
parameter machinery) and `EngineCoreProc._process_input_queue` / `_process_engine_step` (vLLM's read the
core's `has_work()`, `is_running()`, an aborts queue, a watchdog and a `step_fn` returning per-client outputs:
a different loop structure, not a call shape).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from course_fidelity import check_of, vllm_definition
from torch.nn import functional as F

from mini.distributed import tensor_model_parallel_all_reduce
from mini.model.parallel_linear import RowParallelLinear
from mini.model.vocab_parallel_embedding import VocabParallelEmbedding

PHASE = "15_across_processes"
LINEAR = "vllm/model_executor/layers/linear.py"
VOCAB = "vllm/model_executor/layers/vocab_parallel_embedding.py"
CORE_CLIENT = "vllm/v1/engine/core_client.py"


class _Unquantized:
    """vLLM's `UnquantizedLinearMethod.apply` / `UnquantizedEmbeddingMethod.embedding`, for a plain weight."""

    @staticmethod
    def apply(layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    @staticmethod
    def embedding(layer: Any, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, layer.weight)


def test_vllm_row_parallel_linear_forward_passes():
    namespace = {"torch": torch, "Parameter": torch.nn.Parameter,
                 "tensor_model_parallel_all_reduce": tensor_model_parallel_all_reduce,
                 "split_tensor_along_last_dim": None}
    forward = vllm_definition(LINEAR, "RowParallelLinear.forward", namespace)
    vllm_layer = type("RowParallelLinear", (RowParallelLinear,), {
        "forward": forward, "input_is_parallel": True, "skip_bias_add": False, "return_bias": False,
        "quant_method": _Unquantized()})
    check_of(PHASE, "RowParallelLinear")(vllm_layer)


def test_vllm_vocab_parallel_embedding_forward_passes():
    namespace = {"torch": torch, "tensor_model_parallel_all_reduce": tensor_model_parallel_all_reduce,
                 "is_fp8": lambda dtype: False, "ops": None}
    vllm_definition(VOCAB, "get_masked_input_and_mask", namespace)
    forward = vllm_definition(VOCAB, "VocabParallelEmbedding.forward", namespace)

    def shard_indices(self: VocabParallelEmbedding) -> types.SimpleNamespace:
        return types.SimpleNamespace(org_vocab_start_index=self.vocab_start_index,
                                     org_vocab_end_index=self.vocab_end_index, num_org_vocab_padding=0,
                                     added_vocab_start_index=self.vocab_end_index,
                                     added_vocab_end_index=self.vocab_end_index)

    vllm_layer = type("VocabParallelEmbedding", (VocabParallelEmbedding,), {
        "forward": forward, "use_fused_embedding": False, "reduce_results": True, "parallel_group": None,
        "quant_method": _Unquantized(), "shard_indices": property(shard_indices)})
    check_of(PHASE, "VocabParallelEmbedding")(vllm_layer)


def test_vllm_get_core_engine_for_request_passes():
    import sys

    namespace = {"sys": sys, "EngineCoreRequest": Any, "EngineIdentity": Any,
                 "get_late_interaction_engine_index": lambda pooling_params, num_engines: None}
    method = vllm_definition(CORE_CLIENT, "DPLBAsyncMPClient.get_core_engine_for_request", namespace)

    def get_core_engine_for_request(lb_engines, engine_inflight, eng_start_index=0, client_count=1):
        client = types.SimpleNamespace(
            streaming_reqs=set(), reqs_in_flight={}, lb_engines=[[*counts, 0.0][:3] for counts in lb_engines],
            core_engines=list(range(len(lb_engines))), engine_inflight=dict(enumerate(engine_inflight)),
            eng_start_index=eng_start_index, client_count=client_count)
        request = types.SimpleNamespace(request_id="r", resumable=False, data_parallel_rank=None,
                                        pooling_params=None)
        return method(client, request)

    check_of(PHASE, "get_core_engine_for_request")(get_core_engine_for_request)
