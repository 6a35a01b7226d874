"""vLLM v0.33.0's own implementations of phase 09's mirrored functions pass phase 09's checks.

Read from `$MINI_VLLM_SOURCE` (skipped without it); adapted only in their call shape:
* `apply_penalties` (vllm/model_executor/layers/utils.py, called by `apply_all_penalties` in
  vllm/v1/sample/ops/penalties.py): the same signature as mini's `apply_all_penalties`; its import of
  `vllm._custom_ops.apply_repetition_penalties` is served by vLLM's own PyTorch version
  (`apply_repetition_penalties_torch`, what vLLM runs off CUDA).
* `process_dict_updates`, `MinPLogitsProcessor`, `LogitBiasLogitsProcessor` and `MinTokensLogitsProcessor`
  (vllm/v1/sample/logits_processor/builtin.py): as is; `async_tensor_h2d` becomes a plain `torch.tensor`,
  and mini's `LogitsProcessor` base, `BatchUpdate` and `MoveDirectionality` stand in for vLLM's (same
  fields). vLLM's min-p reads `vllm_config.scheduler_config.max_num_seqs`: a subclass hands it mini's
  `LogitsProcessorConfig.max_num_reqs` under that name.
* `condense` has no runnable counterpart: vLLM's `InputBatch.condense` (vllm/v1/worker/gpu_input_batch.py)
  moves every per-request array of vLLM's much larger InputBatch (token ids, sampling tensors, ...), which
  mini's InputBatch does not have. The check grades the invariants, which its rule (the highest row into the
  lowest hole) keeps, and it accepts vLLM's way of reporting the step (each filled hole taken out of `removed`
  with `pop_removed`): tests/course/wrong_answers/test_p09.py::test_another_valid_condense_passes.
* The processor checks feed BatchUpdates built both ways (`removed` as vLLM's code builds it, and as mini's
  builder and vLLM's design document do), with EOS among most requests' stop tokens.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence

import numpy as np
import torch

from labs.checks.p09 import (
    check_apply_all_penalties,
    check_logit_bias_processor,
    check_min_p_processor,
    check_min_tokens_processor,
    check_process_dict_updates,
)
from mini.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from mini.sampling_params import SamplingParams
from tests.course.fidelity import vllm_definition

BUILTIN = "vllm/v1/sample/logits_processor/builtin.py"


def test_vllm_apply_penalties_passes(monkeypatch):
    custom_ops = types.ModuleType("vllm._custom_ops")
    custom_ops.apply_repetition_penalties = vllm_definition(
        "vllm/_custom_ops.py", "apply_repetition_penalties_torch", {"torch": torch})
    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm", types.ModuleType("vllm")))
    monkeypatch.setitem(sys.modules, "vllm._custom_ops", custom_ops)
    namespace = {"torch": torch}
    vllm_definition("vllm/model_executor/layers/utils.py", "get_token_bin_counts_and_mask", namespace)
    apply_penalties = vllm_definition("vllm/model_executor/layers/utils.py", "apply_penalties", namespace)
    check_apply_all_penalties(apply_penalties)


def builtin_namespace() -> dict:
    return {"torch": torch, "np": np, "Sequence": Sequence, "SamplingParams": SamplingParams,
            "BatchUpdate": BatchUpdate,
            "MoveDirectionality": MoveDirectionality, "LogitsProcessor": LogitsProcessor, "T": object,
            "async_tensor_h2d": lambda data, device=None, dtype=None: torch.tensor(data, device=device,
                                                                                    dtype=dtype)}


def test_vllm_process_dict_updates_passes():
    process_dict_updates = vllm_definition(BUILTIN, "process_dict_updates", builtin_namespace())
    check_process_dict_updates(process_dict_updates)


def test_vllm_min_tokens_logits_processor_passes():
    namespace = builtin_namespace()
    vllm_definition(BUILTIN, "process_dict_updates", namespace)
    processor_class = vllm_definition(BUILTIN, "MinTokensLogitsProcessor", namespace)
    check_min_tokens_processor(processor_class)


def test_vllm_min_p_logits_processor_passes():
    processor_class = vllm_definition(BUILTIN, "MinPLogitsProcessor", builtin_namespace())

    class MinPLogitsProcessor(processor_class):   # vLLM's VllmConfig names the batch size max_num_seqs
        def __init__(self, vllm_config, device, is_pin_memory):
            scheduler_config = types.SimpleNamespace(max_num_seqs=vllm_config.max_num_reqs)
            config = types.SimpleNamespace(scheduler_config=scheduler_config)
            super().__init__(config, device, is_pin_memory)

    check_min_p_processor(MinPLogitsProcessor)


def test_vllm_logit_bias_logits_processor_passes():
    namespace = builtin_namespace()
    vllm_definition(BUILTIN, "process_dict_updates", namespace)
    check_logit_bias_processor(vllm_definition(BUILTIN, "LogitBiasLogitsProcessor", namespace))
