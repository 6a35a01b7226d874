"""vLLM v0.33.0's own implementations of phase 14's mirrored functions pass phase 14's checks (issue 27).

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

`QKVParallelLinear.weight_loader` (linear.py, with its `validate_shard_id`) runs as a method of mini's layer on
a parameter given the one attribute an unquantized vLLM weight carries (`output_dim = 0`).

Not adapted: `EngineCoreProc._process_input_queue` / `_process_engine_step` (vLLM's read the core's `has_work()`,
`is_running()`, an aborts queue, a watchdog and a `step_fn` returning per-client outputs, and shutdown is a state
rather than a message on the queue: a different loop structure, not a call shape).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.nn import functional as F

from mini.distributed import tensor_model_parallel_all_reduce
from mini.model.parallel_linear import RowParallelLinear
from mini.model.vocab_parallel_embedding import VocabParallelEmbedding
from tests.course.fidelity import check_of, vllm_definition

PHASE = "14_across_processes"
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


def test_vllm_qkv_weight_loader_passes():
    """vLLM's `QKVParallelLinear.weight_loader` and `validate_shard_id` (vllm/model_executor/layers/linear.py) as
    methods of mini's layer. vLLM's loader dispatches on attributes its quantization methods set on a parameter;
    an unquantized weight of vLLM's carries `output_dim = 0` (the dimension its shards are cut along), so the
    adapter sets that one attribute, and names the two per-rank counts vLLM's layer keeps
    (`num_kv_head_replicas`, `v_head_size`). The quantization branches (block scales, packing, Marlin, fused
    scalars) are never reached by an unquantized weight; their helpers are stubs that fail if called."""
    import logging

    from typing_extensions import TypeIs

    from mini.model.parallel_linear import QKVParallelLinear

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a quantization branch of vLLM's loader ran for an unquantized weight")

    namespace = {"torch": torch, "Parameter": torch.nn.Parameter, "Any": Any, "TypeIs": TypeIs,
                 "BlockQuantScaleParameter": type("BlockQuantScaleParameter", (), {}),
                 "adjust_block_scale_shard": unreachable, "adjust_marlin_shard": unreachable,
                 "adjust_scalar_to_fused_array": unreachable, "logger": logging.getLogger("vllm-adapter")}
    validate_shard_id = vllm_definition(LINEAR, "QKVParallelLinear.validate_shard_id", namespace)
    weight_loader = vllm_definition(LINEAR, "QKVParallelLinear.weight_loader", namespace)

    def loader(self: Any, param: torch.nn.Parameter, loaded_weight: torch.Tensor, shard_id: Any = None) -> None:
        param.output_dim = 0
        weight_loader(self, param, loaded_weight, shard_id)

    vllm_layer = type("QKVParallelLinear", (QKVParallelLinear,), {
        "validate_shard_id": validate_shard_id, "weight_loader": loader,
        "num_kv_head_replicas": property(lambda self: self.kv_partition.replicas),
        "v_head_size": property(lambda self: self.head_size)})
    check_of(PHASE, "QKVParallelLinear")(vllm_layer)
