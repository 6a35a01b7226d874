"""vLLM v0.33.0's own code for phase 13 passes phase 13's checks (its call shape adapted, nothing else).

* `merge_delta_outputs`: `RequestOutput.add(next_output, aggregate=True)` (vllm/outputs.py), which vLLM's
  `RequestOutputCollector.put` calls for DELTA outputs. vLLM merges in place into the output its collector
  owns, so the wrapper hands it a copy of `pending` (with the attributes vLLM's own types carry and mini's do
  not, all None) and returns that copy.
* `generate_stream`: `AsyncLLM.generate` (vllm/v1/engine/async_llm.py), run whole on a stand-in `self` whose
  `add_request` registers a collector and adds the request to the output processor and the engine core (what
  vLLM's `AsyncLLM.add_request` / `_add_request` do) and whose `abort` aborts in both (vLLM's `AsyncLLM.abort`);
  the collector gets vLLM's `get_nowait` / `close` (vllm/v1/engine/output_processor.py). Its
  `except (asyncio.CancelledError, GeneratorExit)` path is what the check grades.
* `determine_num_gpu_blocks`: `request_memory` (vllm/v1/worker/utils.py) for the requested memory, the one
  subtraction of `Worker.determine_available_memory` (vllm/v1/worker/gpu_worker.py: requested - non-KV memory),
  the null-block reservation of `check_enough_kv_cache_memory` followed by vLLM's own
  `_check_enough_kv_cache_memory` (a full-attention request's bytes: its blocks x bytes per block), then
  `get_kv_cache_config_from_groups` (vllm/v1/core/kv_cache_planning.py) run whole on one stub KV-cache group
  whose bytes per block are the check's: its `num_blocks` is the answer.
* `output_handler_step`: vLLM's output handler is a closure inside `AsyncLLM._run_output_handler`, with no
  function of its own to run.
"""

import asyncio
import copy
import logging
import math
from collections import defaultdict
from collections.abc import AsyncGenerator, Mapping, MutableSequence
from types import SimpleNamespace
from typing import Any

from mini.engine.async_llm import RequestOutputCollector
from mini.outputs import RequestOutput
from tests.course.fidelity import check_of, vllm_definition

PHASE = "13_serving"
VLLM_ONLY_FIELDS = ("kv_transfer_params", "ec_transfer_params")
VLLM_ONLY_COMPLETION_FIELDS = ("sampling_mask", "spec_decode_metrics", "routed_experts", "weight_versions")


def _format_gib(num_bytes: int) -> float:
    return round(num_bytes / 2**30, 2)


# ---------------------------------------------------------------- merge_delta_outputs
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


def test_mini_collector_folds_equal_vllms_add_in_order():
    """mini's two folds (the collector's, and the reference the check grades against) give what vLLM's
    `RequestOutput.add` gives, samples in the same order: the check itself does not grade the order."""
    import random

    from mini.engine.output_processor import merge_delta_outputs, replace_by_index
    from mini.outputs import CompletionOutput
    add = vllm_definition("vllm/outputs.py", "RequestOutput.add",
                          {"MutableSequence": MutableSequence, "SamplingMask": None})
    rng = random.Random(0)

    def output(indices):
        return RequestOutput("r", "p", [1], None, [CompletionOutput(i, f"t{rng.random():.3f}", [rng.randrange(99)],
                                                                    None, None) for i in indices], False)

    for _ in range(200):
        pending, new = (output(rng.sample(range(4), rng.randint(1, 4))) for _ in range(2))
        for fold, aggregate in ((merge_delta_outputs, True), (replace_by_index, False)):
            theirs = _with_vllm_fields(pending)
            add(theirs, _with_vllm_fields(new), aggregate=aggregate)
            ours = fold(pending, new)
            assert [(c.index, c.text, list(c.token_ids)) for c in ours.outputs] == \
                [(c.index, c.text, list(c.token_ids)) for c in theirs.outputs], (fold.__name__, pending, new)


# ---------------------------------------------------------------- generate_stream
class _Queue:
    """mini's collector with the two methods vLLM's `generate` also calls on its collector."""

    def __init__(self, collector: RequestOutputCollector, request_id: str) -> None:
        self.collector, self.request_id = collector, request_id

    def get_nowait(self):
        output = self.collector.output
        if output is not None:
            self.collector.output = None
            self.collector.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output

    async def get(self):
        return await self.collector.get()

    def close(self) -> None:
        pass


def vllm_generate_stream():
    errors = {name: type(name, (Exception,), {}) for name in (
        "EngineDeadError", "VLLMClientError", "GracefulHTTPError", "GenerationError", "InputStreamError",
        "EngineGenerateError")}
    namespace = {"asyncio": asyncio, "RequestOutput": RequestOutput, "STREAM_FINISHED": object(),
                 "logger": logging.getLogger("vllm-generate"), "Any": Any, "Mapping": Mapping,
                 "AsyncGenerator": AsyncGenerator, **errors,
                 **dict.fromkeys(("EngineCoreRequest", "PromptType", "EngineInput", "StreamingInput",
                                  "SamplingParams", "LoRARequest", "KvHintsEnvelope"), object)}
    generate = vllm_definition("vllm/v1/engine/async_llm.py", "AsyncLLM.generate", namespace)

    def generate_stream(engine_core, output_processor, collectors, request):
        async def add_request(request_id, prompt, params, **_ignored):
            collector = RequestOutputCollector(params.output_kind, asyncio.get_running_loop())
            collectors[request_id] = collector
            output_processor.add_request(prompt)
            await engine_core.add_request_async(prompt)
            return _Queue(collector, request_id)

        async def abort(request_id, internal=False):
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
            for rid in ids:
                collectors.pop(rid, None)
            output_processor.abort_requests(ids)
            await engine_core.abort_requests_async(ids)

        self = SimpleNamespace(add_request=add_request, abort=abort, log_requests=False)
        return generate(self, request, request.sampling_params, request.request_id)

    return generate_stream


def test_vllm_async_llm_generate_passes_check_generate_stream():
    check_of(PHASE, "generate_stream")(vllm_generate_stream())


# ---------------------------------------------------------------- determine_num_gpu_blocks
class _NoUniformTypeSpecs:
    """Stands for vLLM's UniformTypeKVCacheSpecs: the stub group's spec is not one."""


def vllm_determine_num_gpu_blocks():
    request_memory = vllm_definition("vllm/v1/worker/utils.py", "request_memory",
                                     {"math": math, "format_gib": _format_gib, "logger": logging.getLogger("vllm"),
                                      "MemorySnapshot": object, "CacheConfig": object})
    check_enough = vllm_definition("vllm/v1/core/kv_cache_planning.py", "_check_enough_kv_cache_memory",
                                   {"format_gib": _format_gib, "Callable": object})
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

    def determine_num_gpu_blocks(profile, gpu_memory_utilization, bytes_per_block, block_size, max_model_len):
        snapshot = SimpleNamespace(total_memory=profile.total_bytes, free_memory=profile.total_bytes, device_=0)
        requested = request_memory(snapshot, SimpleNamespace(gpu_memory_utilization=gpu_memory_utilization))
        non_kv_cache_memory = profile.weights_bytes + profile.peak_activation_bytes + profile.non_torch_bytes
        available = requested - non_kv_cache_memory
        check_enough(available - bytes_per_block,   # the null block's bytes set aside, as check_enough_kv_cache_memory
                     lambda: -(-max_model_len // block_size) * bytes_per_block, max_model_len, lambda _memory: 0)
        namespace["_get_kv_cache_bytes_per_block"] = lambda groups, layout: bytes_per_block
        return get_kv_cache_config_from_groups(vllm_config, [group], available).num_blocks

    return determine_num_gpu_blocks


def test_vllm_memory_arithmetic_passes_check_determine_num_gpu_blocks():
    check_of(PHASE, "determine_num_gpu_blocks")(vllm_determine_num_gpu_blocks())
