"""mini's public API is a checked subset of vLLM v0.33.0's: every name mini accepts — `SamplingParams`,
`StructuredOutputsParams`, `BeamSearchParams`, the engine arguments (`LLM(**kwargs)`, `EngineConfig`), the
`serve` flags and the OpenAI request bodies — exists in vLLM with the same default, or is listed below with the
reason it differs. The vLLM side is the committed index of the release (`tests/data/vllm_index.json.gz`, fields
and defaults read from vLLM's source by `scripts/vllm_index.py`), so this runs offline and without vLLM.

A script written against mini therefore runs on vLLM after swapping the import (the README's promise).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
from typing import Any

import pytest

from labs.course.vllm_citations import load_index
from mini import LLM
from mini.config import EngineConfig
from mini.entrypoints.openai import protocol
from mini.entrypoints.openai.api_server import add_serve_arguments
from mini.sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams

REQUIRED = "<required>"
ENGINE_ARGS = "vllm/engine/arg_utils.py::EngineArgs"
CONFIGS = {  # EngineArgs defaults such as `SchedulerConfig.policy` point into these
    "ModelConfig": "vllm/config/model.py::ModelConfig",
    "CacheConfig": "vllm/config/cache.py::CacheConfig",
    "SchedulerConfig": "vllm/config/scheduler.py::SchedulerConfig",
    "CompilationConfig": "vllm/config/compilation.py::CompilationConfig",
    "ParallelConfig": "vllm/config/parallel.py::ParallelConfig",
    "AttentionConfig": "vllm/config/attention.py::AttentionConfig",
}

# Names mini accepts that vLLM v0.33.0 does not have (by that name), and why.
MINI_OWN = {
    "EngineConfig.device": "vLLM takes the device from its platform (CUDA, ROCm, CPU builds); mini runs on the "
                           "CPU by default and takes the device as an argument",
    "serve.device": "as EngineConfig.device",
    "EngineConfig.parts": "the course's replaced parts (mini/roles.py), set by labs.plug; no engine argument or flag "
                          "(metadata engine_arg=False), as vLLM's `scheduler_cls` names a class in a config",
    "serve.chat_template_fuel": "vLLM's environment variable VLLM_CHAT_TEMPLATE_FUEL (same default), a flag in mini",
    "serve.chat_template_render_timeout": "vLLM's environment variable VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT (same "
                                          "default), a flag in mini",
    "serve.max_request_body_size": "vLLM's environment variable VLLM_HTTP_MAX_REQUEST_BODY_SIZE (same default), "
                                   "a flag in mini",
    "serve.keep_alive_on_engine_death": "vLLM's environment variable VLLM_KEEP_ALIVE_ON_ENGINE_DEATH (same "
                                        "default), a flag in mini",
}

# Names both accept whose default differs, and why (same meaning unless the reason says otherwise).
DEFAULT_DIFFERS = {
    "EngineConfig.model": "vLLM's default is a hub model id (downloaded); mini's None is the shipped tiny model "
                          "(offline)",
    "EngineConfig.block_size": "vLLM's None resolves per platform and backend (16 on CUDA); mini fixes 16",
    "EngineConfig.max_num_seqs": "vLLM's None resolves by usage context and GPU (256 or more for LLM); mini's "
                                 "64 suits a CPU",
    "EngineConfig.max_num_batched_tokens": "vLLM's None resolves by usage context (8192 or more for LLM on a "
                                           "GPU); mini's 512 suits a CPU",
    "EngineConfig.enable_chunked_prefill": "vLLM's None resolves to True in v1: the same",
    "EngineConfig.enable_prefix_caching": "vLLM's None resolves to True in v1; mini keeps it off unless asked "
                                          "so that phases 01-09 show the pool without cached blocks (phase 10 "
                                          "turns it on)",
    "EngineConfig.max_cudagraph_capture_size": "both None: derived (vLLM from max_num_seqs and the speculative "
                                               "config; mini from max_num_seqs)",
    "EngineConfig.dtype": "vLLM's 'auto' takes the checkpoint's dtype (bf16 on GPU); mini's float32 keeps CPU "
                          "output token-exact with transformers",
    "EngineConfig.compilation_config": "vLLM's default CompilationConfig compiles (mode 3, VLLM_COMPILE, at -O2); "
                                        "mini's None is mode 0, eager: on a CPU compiling did not pay for itself "
                                        "(README, `python -m mini bench compile`)",
    "EngineConfig.async_scheduling": "vLLM's None turns it on unless the config is incompatible; mini keeps it "
                                     "off: on a CPU it saved nothing (README, `python -m mini bench distributed`) "
                                     "and the course's views step one step at a time",
    "serve.async_scheduling": "as EngineConfig.async_scheduling",
    "EngineConfig.logits_processors": "vLLM's None and mini's empty list both mean no custom processor",
    "serve.host": "vLLM's None listens on every interface; mini listens on 127.0.0.1 unless told otherwise",
    "serve.model": "vLLM's positional model_tag; mini's None is the shipped tiny model",
    "serve.log_level": "vLLM's None leaves uvicorn's own default, which is 'info': the same",
    "serve.max_num_seqs": "as EngineConfig.max_num_seqs",
    "serve.max_num_batched_tokens": "as EngineConfig.max_num_batched_tokens",
    "serve.block_size": "as EngineConfig.block_size",
    "serve.enable_prefix_caching": "as EngineConfig.enable_prefix_caching",
    "serve.dtype": "as EngineConfig.dtype",
    "CompletionRequest.stop": "vLLM's [] and mini's None both mean no stop string",
    "CompletionRequest.stop_token_ids": "vLLM's [] and mini's None both mean none",
    "CompletionRequest.presence_penalty": "vLLM's None means 0.0 (the default SamplingParams)",
    "CompletionRequest.frequency_penalty": "vLLM's None means 0.0",
    "CompletionRequest.skip_special_tokens": "vLLM's None means True (SamplingParams' default)",
    "CompletionRequest.prompt": "vLLM also takes prompt_embeds, so prompt may be absent there; mini requires it",
    "ChatCompletionRequest.stop": "as CompletionRequest.stop",
    "ChatCompletionRequest.stop_token_ids": "as CompletionRequest.stop_token_ids",
    "ChatCompletionRequest.presence_penalty": "as CompletionRequest.presence_penalty",
    "ChatCompletionRequest.frequency_penalty": "as CompletionRequest.frequency_penalty",
    "ChatCompletionRequest.skip_special_tokens": "as CompletionRequest.skip_special_tokens",
    "ChatCompletionRequest.top_logprobs": "vLLM's 0 and mini's None both mean no alternatives per token",
    # EngineArgs points these at vllm/config/lora.py's LoRAConfig, whose fields the committed index does not hold:
    # the values are the same (max_loras 1, max_lora_rank 16, max_cpu_loras None -> max_loras).
    "EngineConfig.max_loras": "vLLM's LoRAConfig.max_loras, 1: the same",
    "EngineConfig.max_lora_rank": "vLLM's LoRAConfig.max_lora_rank, 16: the same",
    "EngineConfig.max_cpu_loras": "vLLM's LoRAConfig.max_cpu_loras, None (then max_loras): the same",
    "serve.max_loras": "as EngineConfig.max_loras",
    "serve.max_lora_rank": "as EngineConfig.max_lora_rank",
    "serve.max_cpu_loras": "as EngineConfig.max_cpu_loras",
}


def _literal(source: str | None, index: dict) -> Any:
    """A vLLM default (source text from the index) as a Python value where it is a literal; `Config.field`
    references are followed into the config classes; anything else stays text."""
    if source is None:
        return REQUIRED
    config, _, field = source.partition(".")
    if config in CONFIGS and field:
        return _literal(index["fields"][CONFIGS[config]].get(field), index)
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return source


def _vllm_defaults(*keys: str) -> dict[str, Any]:
    index = load_index()
    found: dict[str, Any] = {}
    for key in keys:
        found.update({name: _literal(src, index) for name, src in index["fields"][key].items()})
    return found


def _dataclass_defaults(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
            out[field.name] = f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else value
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = f"{field.default_factory.__name__}()"
        else:
            out[field.name] = REQUIRED
    return out


def _pydantic_defaults(cls: type) -> dict[str, Any]:
    return {(f.alias or name): (REQUIRED if f.is_required() else f.default) for name, f in cls.model_fields.items()}


def _signature_defaults(function: Any) -> dict[str, Any]:
    params = list(inspect.signature(function).parameters.values())[1:]   # without self
    return {p.name: (REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in params
            if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}


def _serve_flags() -> dict[str, Any]:
    parser = add_serve_arguments(argparse.ArgumentParser())
    return {a.dest: a.default for a in parser._actions if a.dest != "help"}


SURFACES = {
    # label: (mini's names and defaults, the vLLM classes that define the same names)
    "SamplingParams": (lambda: _dataclass_defaults(SamplingParams), ["vllm/sampling_params.py::SamplingParams"]),
    "StructuredOutputsParams": (lambda: _dataclass_defaults(StructuredOutputsParams),
                                ["vllm/sampling_params.py::StructuredOutputsParams"]),
    "BeamSearchParams": (lambda: _dataclass_defaults(BeamSearchParams),
                         ["vllm/sampling_params.py::BeamSearchParams"]),
    "EngineConfig": (lambda: _dataclass_defaults(EngineConfig), [ENGINE_ARGS]),
    "LLM": (lambda: _signature_defaults(LLM.__init__), [ENGINE_ARGS]),
    "serve": (_serve_flags, [ENGINE_ARGS, "vllm/entrypoints/common/cli_args.py::FrontendArgs",
                             "vllm/entrypoints/common/cli_args.py::BaseFrontendArgs"]),
    "CompletionRequest": (lambda: _pydantic_defaults(protocol.CompletionRequest),
                          ["vllm/entrypoints/openai/completion/protocol.py::CompletionRequest"]),
    "ChatCompletionRequest": (lambda: _pydantic_defaults(protocol.ChatCompletionRequest),
                              ["vllm/entrypoints/openai/chat_completion/protocol.py::ChatCompletionRequest"]),
}
SERVE_ALIASES = {"model": "model_tag"}
SAME_AS = {"LLM": "EngineConfig"}   # LLM(**kwargs) takes EngineConfig's fields: one list of reasons for both


def _listed(table: dict[str, str], label: str, name: str) -> bool:
    # mini's positional `model` is vllm serve's `model_tag`
    return f"{label}.{name}" in table or f"{SAME_AS.get(label, label)}.{name}" in table


def _differences(label: str) -> tuple[list[str], list[str]]:
    mini_names, vllm_keys = SURFACES[label]
    vllm = _vllm_defaults(*vllm_keys)
    if label == "serve":
        vllm["model_tag"] = vllm.get("model_tag", REQUIRED)
    unknown, differing = [], []
    for name, default in mini_names().items():
        qualified = f"{label}.{name}"
        vllm_name = SERVE_ALIASES.get(name, name) if label == "serve" else name
        if vllm_name not in vllm and name != "model":
            if not _listed(MINI_OWN, label, name):
                unknown.append(f"{qualified} (default {default!r}) is not a vLLM v0.33.0 name")
        elif name != "model" and vllm[vllm_name] != default and not _listed(DEFAULT_DIFFERS, label, name):
            differing.append(f"{qualified}: mini's default {default!r}, vLLM's {vllm[vllm_name]!r}")
    return unknown, differing


@pytest.mark.parametrize("label", list(SURFACES))
def test_every_public_name_is_vllms_with_its_default(label):
    unknown, differing = _differences(label)
    assert not unknown, "names vLLM does not have (rename, or list in MINI_OWN with the reason):\n" + "\n".join(
        unknown)
    assert not differing, "defaults that differ from vLLM (match, or list in DEFAULT_DIFFERS with the reason):\n" + \
        "\n".join(differing)


def test_every_listed_difference_is_still_a_difference():
    """An entry of MINI_OWN or DEFAULT_DIFFERS that no longer differs is stale: delete it."""
    listed = set(MINI_OWN) | set(DEFAULT_DIFFERS)
    live: set[str] = set()
    for label, (mini_names, vllm_keys) in SURFACES.items():
        vllm = _vllm_defaults(*vllm_keys)
        for name, default in mini_names().items():
            vllm_name = SERVE_ALIASES.get(name, name) if label == "serve" else name
            if vllm_name not in vllm or vllm[vllm_name] != default:
                live.add(f"{SAME_AS.get(label, label)}.{name}")
    assert listed <= live, f"listed but no longer different: {sorted(listed - live)}"


def test_a_renamed_field_would_be_caught(monkeypatch):
    """The check can fail: a SamplingParams field vLLM does not have is reported."""
    renamed = dataclasses.make_dataclass("SamplingParams", [("topp", float, 1.0)])
    monkeypatch.setitem(SURFACES, "SamplingParams", (lambda: _dataclass_defaults(renamed),
                                                     ["vllm/sampling_params.py::SamplingParams"]))
    unknown, _ = _differences("SamplingParams")
    assert unknown == ["SamplingParams.topp (default 1.0) is not a vLLM v0.33.0 name"]
