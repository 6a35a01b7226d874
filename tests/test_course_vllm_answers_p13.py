"""vLLM v0.33.0's own code for phase 13 passes phase 13's checks (its call shape adapted, nothing else).

* `num_blocks_for_budget`: `get_kv_cache_config_from_groups` (vllm/v1/core/kv_cache_planning.py), run whole on
  one stub KV-cache group that holds no layers and whose bytes per block are the check's `bytes_per_block`
  (`_get_kv_cache_bytes_per_block` and the layout are stubs; `may_override_num_blocks` is vLLM's own, with no
  override); its `num_blocks` is the answer: `available_memory // bytes_per_block`, the null block among them.
* `merge_delta_outputs`: `RequestOutput.add(next_output, aggregate=True)` (vllm/outputs.py), which vLLM's
  `RequestOutputCollector.put` calls for DELTA outputs. vLLM merges in place into the output its collector
  owns, so the wrapper hands it a copy of `pending` (with the attributes vLLM's own types carry and mini's do
  not, all None) and returns that copy.
* `completion_stream_choices` is inline code in `OpenAIServingCompletion.completion_stream_generator`
  (vllm/entrypoints/openai/completion/serving.py), with no function of its own to run.
"""

import copy
from collections import defaultdict
from collections.abc import MutableSequence
from types import SimpleNamespace

from course_fidelity import check_of, vllm_definition

PHASE = "13_serving"
VLLM_ONLY_FIELDS = ("kv_transfer_params", "ec_transfer_params")
VLLM_ONLY_COMPLETION_FIELDS = ("sampling_mask", "spec_decode_metrics", "routed_experts", "weight_versions")


class _NoUniformTypeSpecs:
    """Stands for vLLM's UniformTypeKVCacheSpecs: the stub group's spec is not one."""


def vllm_num_blocks_for_budget():
    namespace = {"defaultdict": defaultdict, "UniformTypeKVCacheSpecs": _NoUniformTypeSpecs,
                 "KVCacheConfig": lambda **fields: SimpleNamespace(**fields),
                 "validate_kv_cache_layout": lambda layout, groups: None}
    namespace["may_override_num_blocks"] = vllm_definition(
        "vllm/v1/core/kv_cache_planning.py", "may_override_num_blocks", namespace)
    get_kv_cache_config_from_groups = vllm_definition(
        "vllm/v1/core/kv_cache_planning.py", "get_kv_cache_config_from_groups", namespace)
    layout = SimpleNamespace(is_block_outermost=True, is_block_compact=True)
    vllm_config = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
                                     get_resolved_kv_cache_layout=lambda: layout))
    group = SimpleNamespace(kv_cache_spec=object(), layer_names=[], host_resident=False)

    def num_blocks_for_budget(budget_bytes, bytes_per_block):
        namespace["_get_kv_cache_bytes_per_block"] = lambda groups, layout: bytes_per_block
        return get_kv_cache_config_from_groups(vllm_config, [group], budget_bytes).num_blocks

    return num_blocks_for_budget


def test_vllm_block_count_passes_check_num_blocks_for_budget():
    check_of(PHASE, "num_blocks_for_budget")(vllm_num_blocks_for_budget())


def _with_vllm_fields(output):
    """A deep copy of a mini RequestOutput as a plain object carrying the extra fields vLLM's `add` reads."""
    completions = [SimpleNamespace(**vars(c) if hasattr(c, "__dict__") else
                                   {f: getattr(c, f) for f in c.__dataclass_fields__},
                                   **dict.fromkeys(VLLM_ONLY_COMPLETION_FIELDS))
                   for c in copy.deepcopy(output.outputs)]
    fields = {f: copy.deepcopy(getattr(output, f)) for f in output.__dataclass_fields__ if f != "outputs"}
    return SimpleNamespace(**fields, outputs=completions, **dict.fromkeys(VLLM_ONLY_FIELDS))


def vllm_merge_delta_outputs():
    add = vllm_definition("vllm/outputs.py", "RequestOutput.add",
                          {"MutableSequence": MutableSequence, "SamplingMask": None})

    def merge_delta_outputs(pending, new):
        merged = _with_vllm_fields(pending)
        add(merged, _with_vllm_fields(new), aggregate=True)
        return merged

    return merge_delta_outputs


def test_vllm_request_output_add_passes_check_merge_delta_outputs():
    check_of(PHASE, "merge_delta_outputs")(vllm_merge_delta_outputs())
