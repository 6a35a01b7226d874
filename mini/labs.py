"""Mirrors no vllm/v1 file: run the real engine with a learner's implementation of a lab function.

    from mini import LLM, SamplingParams
    from mini.labs import plug

    with plug(FreeKVCacheBlockQueue=MyQueue, get_new_blocks=my_get_new_blocks):
        llm = LLM(num_gpu_blocks_override=64)          # built inside: the pool uses MyQueue
        outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8))

`plug` monkeypatches the reference object a lab name stands for (see `LAB_TARGETS`), and also every
`mini.*` module that imported that same object by name, then restores everything on exit, even
after an error. Engine code calls pluggable functions through their module or class at call time,
so the patch reaches a running engine (mini/README.md, "Swappable functions").
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# lab name -> (module, attribute path inside it). Attribute paths with a dot patch a class attribute.
LAB_TARGETS: dict[str, tuple[str, str]] = {
    # phase 00: the autoregressive loop
    "kv_bytes_per_block": ("mini.engine.llm_engine", "LLMEngine.kv_bytes_per_block"),
    # phase 01: paged KV memory
    "FreeKVCacheBlockQueue": ("mini.core.kv_cache_utils", "FreeKVCacheBlockQueue"),
    "get_new_blocks": ("mini.core.block_pool", "BlockPool.get_new_blocks"),
    "free_blocks": ("mini.core.block_pool", "BlockPool.free_blocks"),
    "allocate_slots": ("mini.core.kv_cache_manager", "KVCacheManager.allocate_slots"),
    "free": ("mini.core.kv_cache_manager", "KVCacheManager.free"),
    # phase 02: slot_mapping and the flat batch
    "compute_slot_mapping": ("mini.worker.prepare_inputs", "compute_slot_mapping"),
    "compute_positions": ("mini.worker.prepare_inputs", "compute_positions"),
    "compute_query_start_loc": ("mini.worker.prepare_inputs", "compute_query_start_loc"),
    "prepare_inputs": ("mini.worker.prepare_inputs", "prepare_inputs"),
    # phase 03: paged attention in PyTorch
    "store_kv": ("mini.attention.reference", "store_kv"),
    "paged_attention": ("mini.attention.reference", "paged_attention"),
    "gather_kv": ("mini.attention.reference", "gather_kv"),
    # phase 04: the model runner
    "compute_logits_indices": ("mini.worker.prepare_inputs", "compute_logits_indices"),
    "rms_norm": ("mini.model.llama", "rms_norm"),
    "apply_rotary": ("mini.model.rotary", "apply_rotary"),
    "build_attention_metadata": ("mini.worker.model_runner", "build_attention_metadata"),
    "run_model": ("mini.worker.model_runner", "run_model"),
    "update_states": ("mini.worker.model_runner", "ModelRunner.update_states"),
    # phase 05: the scheduler
    "num_tokens_to_schedule": ("mini.core.sched.scheduler", "num_tokens_to_schedule"),
    "select_preemption_victim": ("mini.core.sched.scheduler", "select_preemption_victim"),
    "schedule": ("mini.core.sched.scheduler", "Scheduler.schedule"),
    # phase 06: the engine loop and I/O
    "detokenize_incrementally": ("mini.engine.detokenizer", "detokenize_incrementally"),
    "check_stop_strings": ("mini.engine.detokenizer", "check_stop_strings"),
    "check_stop": ("mini.core.sched.utils", "check_stop"),
    "step": ("mini.engine.llm_engine", "LLMEngine.step"),
    # phase 07: the attention kernel in Triton
    "online_softmax_update": ("mini.viz.kernel_access", "online_softmax_update"),
    "_store_kv_kernel": ("mini.attention.triton_paged", "_store_kv_kernel"),
    "triton_store_kv": ("mini.attention.triton_paged", "store_kv"),
    "_paged_decode_kernel": ("mini.attention.triton_paged", "_paged_decode_kernel"),
    "paged_decode": ("mini.attention.triton_paged", "paged_decode"),
    # phase 08: the vectorized sampler
    "apply_temperature": ("mini.sample.sampler", "apply_temperature"),
    "apply_top_k_top_p": ("mini.sample.ops.topk_topp", "apply_top_k_top_p"),
    "random_sample": ("mini.sample.ops.topk_topp_sampler", "random_sample"),
    "gather_logprobs": ("mini.sample.logprobs", "gather_logprobs"),
    # phase 09: penalties and logits processors
    "apply_all_penalties": ("mini.sample.ops.penalties", "apply_all_penalties"),
    "process_dict_updates": ("mini.sample.logits_processor.state", "process_dict_updates"),
    "MinTokensLogitsProcessor": ("mini.sample.logits_processor.builtin", "MinTokensLogitsProcessor"),
    "condense": ("mini.worker.input_batch", "InputBatch.condense"),
}


@dataclass(slots=True)
class _Patch:
    owner: Any  # a module or a class
    attribute: str
    original: Any  # the raw value in owner.__dict__ (keeps staticmethod/classmethod wrappers)


def _resolve(name: str) -> tuple[Any, str]:
    module_name, path = LAB_TARGETS[name]
    owner: Any = importlib.import_module(module_name)
    *parents, attribute = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    if attribute not in vars(owner):
        raise ValueError(
            f"lab target {module_name}:{path} for {name!r} does not exist in this version of mini"
        )
    return owner, attribute


def _wrap_like(original: Any, replacement: Any) -> Any:
    """Keep a staticmethod/classmethod a staticmethod/classmethod when the learner passes a function."""
    if isinstance(original, staticmethod) and not isinstance(replacement, staticmethod):
        return staticmethod(replacement)
    if isinstance(original, classmethod) and not isinstance(replacement, classmethod):
        return classmethod(replacement)
    return replacement


def _aliases(original: Any, owner: Any) -> list[tuple[Any, str]]:
    """Other mini modules holding the same object under a module-level name (`from x import f`)."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if module is None or module is owner or not module_name.startswith("mini."):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                found.append((module, attribute))
    return found


def _check_replacement(name: str, replacement: Any) -> None:
    if not callable(replacement) and not isinstance(replacement, (staticmethod, classmethod)):
        raise TypeError(f"plug({name}=...) needs a function or class, got {type(replacement).__name__}")


@contextlib.contextmanager
def plug(**replacements: Any) -> Iterator[None]:
    """Replace the reference implementation of each named lab function inside the `with` block."""
    unknown = sorted(set(replacements) - set(LAB_TARGETS))
    if unknown:
        raise ValueError(f"unknown lab name(s) {unknown}; allowed names: {sorted(LAB_TARGETS)}")
    for name, replacement in replacements.items():
        _check_replacement(name, replacement)
    patches: list[_Patch] = []
    try:
        for name, replacement in replacements.items():
            owner, attribute = _resolve(name)
            original = vars(owner)[attribute]
            targets = [(owner, attribute)]
            if inspect.ismodule(owner):
                targets += _aliases(original, owner)
            for target_owner, target_attribute in targets:
                raw = vars(target_owner)[target_attribute]
                patches.append(_Patch(target_owner, target_attribute, raw))
                setattr(target_owner, target_attribute, _wrap_like(raw, replacement))
        yield
    finally:
        for patch in reversed(patches):
            setattr(patch.owner, patch.attribute, patch.original)


def lab_names() -> list[str]:
    """Every name `plug` accepts."""
    return sorted(LAB_TARGETS)
