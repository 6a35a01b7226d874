"""Roles: the few places where the engine lets an implementation be chosen, resolved once where each is built.

Mirrors vLLM's ways of choosing a class when the engine is built, never per call: `scheduler_cls` in
SchedulerConfig (vllm/config/scheduler.py), `logits_processors=[cls]`, `CustomOp.register_oot`
(vllm/model_executor/custom_op.py), and the attention selector (vllm/v1/attention/selector.py).
mini names its roles in the table below. Each role has a home: one or a few classes (the block pool,
the scheduler, the sampler, ...) whose *parts* are class attributes (methods, static functions, a nested
class, a Triton kernel). A part is what a course exercise writes.

    from mini import roles
    roles.ROLES                      # every role and its parts; importing `mini` imports no engine module
    roles.reference("touch")         # the engine's own implementation of a part

    config = EngineConfig(parts={"touch": my_touch})   # what was replaced is a config field
    BlockPoolClass = roles.resolve(config, BlockPool)  # BlockPool itself, or a subclass with my_touch as `touch`

The replaced parts travel in `EngineConfig.parts` (into the engine-core and worker processes with the rest
of the config), and each component resolves its own class from the config where it is built. A home class
with none of its parts replaced is used as is: that is the engine's fast class. Where the fast class fuses
or skips some parts (the sampler's fused top-k draw, the runner's persistent input buffers, the Triton
bitmask kernel, the CPU attention kernels), the role names a readable *reference class* beside it
(`Role.reference_classes`), which calls every part; replacing a part builds that reference class, with the
part in place. No fast path asks what was replaced. A reference static function that calls a sibling part
takes it as a keyword-only parameter of the same name (`def subset_construction(nfa, *,
epsilon_closure=epsilon_closure)`): when the sibling is replaced, `resolve` binds the replacement there.

`use(**parts)` (what the course's `labs.plug` calls) makes parts the default choice of every engine
*built* inside the `with` block (`with_pending` copies them into the engine's config); an engine built
outside it, or before it, keeps what it chose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Role:
    """A place where the engine lets an implementation be chosen: its home classes and their parts."""

    name: str
    summary: str
    homes: Mapping[str, tuple[str, ...]]  # "module:Class" -> the parts (class attribute names) it holds
    # "module:FastClass" -> "module:ReferenceClass": where the engine's fast class fuses or skips the parts, the
    # readable class that calls each of them; an engine replacing one of them builds the reference class.
    reference_classes: Mapping[str, str] = field(default_factory=dict)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(part for parts in self.homes.values() for part in parts)


ROLES: tuple[Role, ...] = (
    Role("kv_cache",
         "blocks of the paged KV cache: the free queue, allocation, hashing, prefix-cache hits and eviction",
         {"mini.core.block_pool:BlockPool": ("FreeKVCacheBlockQueue", "get_new_blocks", "free_blocks", "touch",
                                             "cache_full_blocks", "_maybe_evict_cached_block"),
          "mini.core.kv_cache_manager:KVCacheManager": ("allocate_slots", "get_computed_blocks",
                                                        "hash_block_tokens", "hash_request_tokens")}),
    Role("scheduler",
         "the scheduling policy step: who runs, how many tokens each, who is preempted, when a request stops",
         {"mini.core.sched.scheduler:Scheduler": ("schedule", "num_tokens_to_schedule", "select_preemption_victim",
                                                  "check_stop")}),
    Role("input_preparation", "the persistent batch and the flat tensors of one forward pass",
         {"mini.worker.model_runner:ModelRunner": ("update_states", "prepare_inputs", "compute_query_start_loc",
                                                   "compute_positions", "compute_slot_mapping",
                                                   "build_attention_metadata",
                                                   "run_model"),
          "mini.worker.input_batch:InputBatch": ("condense",)},
         {"mini.worker.model_runner:ModelRunner": "mini.worker.model_runner:ReferenceModelRunner"}),
    Role("model", "the decoder's own operators, the classes of its layers that hold a tensor-parallel collective, "
                  "its quantized weights (rounding to int8 at load, reading a GPTQ checkpoint's 4-bit words), and the "
                  "LoRA layers' token-to-adapter mapping and batched shrink / expand",
         {"mini.model.llama:LlamaForCausalLM": ("rms_norm", "apply_rotary", "RowParallelLinear",
                                                "VocabParallelEmbedding"),
          "mini.model.quantization.int8:Int8LinearMethod": ("quantize_int8_per_channel",),
          "mini.model.quantization.gptq:GPTQLinearMethod": ("unpack_int4_rows",),
          "mini.lora.punica_wrapper:PunicaWrapper": ("compute_token_lora_indices", "lora_shrink", "lora_expand")},
         {"mini.lora.punica_wrapper:PunicaWrapper": "mini.lora.punica_wrapper:ReferencePunicaWrapper"}),
    Role("attention", "the attention backend: write K/V into the paged cache, attend over it",
         {"mini.attention.reference:ReferenceAttentionBackend": ("store_kv", "gather_kv", "paged_attention"),
          "mini.attention.triton_paged:TritonAttentionBackend": ("triton_store_kv", "paged_decode",
                                                                 "_store_kv_kernel", "_paged_decode_kernel")},
         {"mini.attention.cpu_paged:CpuAttentionBackend": "mini.attention.reference:ReferenceAttentionBackend"}),
    Role("sampler", "logits -> tokens: temperature, penalties, top-k/top-p, sampling, logprobs, logits processors, "
                    "rejection sampling of drafts",
         {"mini.sample.sampler:Sampler": ("apply_temperature", "apply_bad_words", "apply_all_penalties",
                                          "apply_top_k_top_p", "random_sample", "gather_logprobs"),
          "mini.sample.logits_processor.state:LogitsProcessors": ("process_dict_updates", "MinPLogitsProcessor",
                                                                   "LogitBiasLogitsProcessor",
                                                                   "MinTokensLogitsProcessor"),
          "mini.sample.rejection_sampler:RejectionSampler": ("compute_residual_probs", "rejection_sample")},
         {"mini.sample.sampler:Sampler": "mini.sample.sampler:ReferenceSampler"}),
    Role("drafter", "proposes draft tokens for speculative decoding",
         {"mini.spec_decode.ngram_proposer:NgramProposer": ("propose_ngram",),
          "mini.spec_decode.eagle:EagleProposer": ("prepare_eagle_inputs", "compute_draft_slots")}),
    Role("structured_output", "grammar -> token automaton -> per-step bitmask, and applying the mask",
         {"mini.structured_output.backend_mini:MiniGrammarCompiler": ("epsilon_closure", "subset_construction",
                                                                      "pack_allowed", "allowed_token_ids"),
          "mini.structured_output.bitmask:BitmaskApplier": ("apply_token_bitmask_inplace",)},
         {"mini.structured_output.bitmask:BitmaskApplier": "mini.structured_output.bitmask:TorchBitmaskApplier"}),
    Role("detokenizer", "token ids -> text, a few bytes at a time, and stop strings",
         {"mini.engine.detokenizer:OffsetIncrementalDetokenizer": ("detokenize_incrementally",
                                                                   "check_stop_strings")}),
    Role("data_parallel", "which of N data-parallel engine cores takes a new request (least loaded)",
         {"mini.engine.dp_routing:DPLoadBalancer": ("get_core_engine_for_request",)}),
)

_ROLE_OF_PART: dict[str, Role] = {part: role for role in ROLES for part in role.parts}
_HOME_OF_PART: dict[str, str] = {part: home for role in ROLES for home, parts in role.homes.items()
                                 for part in parts}
_REFERENCE_CLASS: dict[str, str] = {fast: readable for role in ROLES
                                    for fast, readable in role.reference_classes.items()}
if len(_ROLE_OF_PART) != sum(len(role.parts) for role in ROLES):  # pragma: no cover - a table error
    raise RuntimeError("a part is listed twice in mini.roles.ROLES")


def part_names() -> list[str]:
    """Every part an implementation may replace, sorted."""
    return sorted(_ROLE_OF_PART)


def role_of(part: str) -> Role:
    """The role a part belongs to."""
    if part not in _ROLE_OF_PART:
        raise KeyError(f"no part named {part!r}; parts: {part_names()}")
    return _ROLE_OF_PART[part]


def _import_class(key: str) -> type:
    module_name, class_name = key.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def home_class(part: str) -> type:
    """The class whose attribute `part` is (imports its module on first use)."""
    role_of(part)
    return _import_class(_HOME_OF_PART[part])


def reference(part: str) -> Any:
    """The engine's own implementation of `part` (a function, a method's function, a class or a kernel)."""
    value = inspect.getattr_static(home_class(part), part)
    return value.__func__ if isinstance(value, staticmethod) else value


def _home_key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def validate(parts: Mapping[str, Any]) -> None:
    """A clear error for a name that is no part, or a value that is not callable."""
    if not isinstance(parts, Mapping):
        raise TypeError(f"parts must be a dict of part name -> function, got {type(parts).__name__}")
    unknown = sorted(set(parts) - set(_ROLE_OF_PART))
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; allowed names: {part_names()}")
    for name, value in parts.items():
        if not callable(value):
            raise TypeError(f"part {name!r} needs a function, a class or a kernel, got {type(value).__name__}")


_PENDING: list[dict[str, Any]] = []   # process-wide, like an import: an engine built on another thread sees it
_PENDING_LOCK = threading.Lock()


@contextlib.contextmanager
def use(**parts: Any) -> Iterator[None]:
    """Make `parts` the choice of every engine built inside the `with` block (nested blocks stack)."""
    validate(parts)
    frame = dict(parts)
    with _PENDING_LOCK:
        _PENDING.append(frame)
    try:
        yield
    finally:
        with _PENDING_LOCK:
            for index in range(len(_PENDING) - 1, -1, -1):
                if _PENDING[index] is frame:
                    del _PENDING[index]
                    break


def pending() -> dict[str, Any]:
    """The parts `use` blocks currently make the default (inner blocks win)."""
    merged: dict[str, Any] = {}
    with _PENDING_LOCK:
        for frame in _PENDING:
            merged.update(frame)
    return merged


def with_pending(config: Any, parts: Mapping[str, Any] | None = None) -> Any:
    """`config` with the parts of enclosing `use` blocks, then its own `parts`, then `parts`, in `config.parts`.

    What an engine does once, when it is built (LLMEngine, EngineCore); `config` itself when nothing is chosen.
    """
    chosen = {**pending(), **config.parts, **(parts or {})}
    if chosen == dict(config.parts):
        return config
    return dataclasses.replace(config, parts=chosen)


def replaced(config: Any, *role_names: str) -> tuple[str, ...]:
    """The parts of the roles `role_names` that `config` replaces (empty: they run the engine's own)."""
    parts = getattr(config, "parts", None) or {}
    return tuple(part for part in parts if _ROLE_OF_PART[part].name in role_names)


_BUILT: dict[tuple, tuple[type, tuple[Any, ...]]] = {}   # (class, parts by identity) -> (subclass, the parts)
_BUILT_LOCK = threading.Lock()


def resolve(config: Any, cls: type) -> type:
    """The class the engine configured by `config` builds where the code names `cls`.

    `cls` itself when `config.parts` (None: no config) replaces none of the parts that class runs; else the
    role's reference class for `cls` (`Role.reference_classes`; `cls` when it has none) subclassed once, with
    the parts in place of its own.
    """
    parts = getattr(config, "parts", None) or {}
    key = _home_key(cls)
    reference_key = _REFERENCE_CLASS.get(key, key)
    mine = {part: value for part, value in parts.items() if _HOME_OF_PART[part] in (key, reference_key)}
    if not mine:
        return cls
    base = cls if reference_key == key else _import_class(reference_key)
    cache_key = (base, tuple(sorted((name, id(value)) for name, value in mine.items())))
    with _BUILT_LOCK:
        if cache_key not in _BUILT:   # the parts are held too, so no id is reused while the entry lives
            _BUILT[cache_key] = (with_parts(base, mine), tuple(mine.values()))
        return _BUILT[cache_key][0]


def with_parts(cls: type, parts: Mapping[str, Any]) -> type:
    """A subclass of home class `cls` with `parts` in place of its own (static parts stay static)."""
    attributes: dict[str, Any] = {"__module__": cls.__module__}
    for name, value in parts.items():
        attributes[name] = staticmethod(value) if isinstance(inspect.getattr_static(cls, name), staticmethod) \
            else value
    # A reference static part that calls a sibling takes it as a keyword-only parameter: bind the replacement.
    for name in dir(cls):
        if name in parts:
            continue
        raw = inspect.getattr_static(cls, name, None)
        if not isinstance(raw, staticmethod) or name not in _ROLE_OF_PART:
            continue
        siblings = {p: parts[p] for p in _keyword_only(raw.__func__) if p in parts}
        if siblings:
            attributes[name] = staticmethod(functools.partial(raw.__func__, **siblings))
    return type(f"{cls.__name__}[{', '.join(sorted(parts))}]", (cls,), attributes)


def _keyword_only(function: Any) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    return [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


__all__ = ["ROLES", "Role", "home_class", "part_names", "pending", "reference", "replaced", "resolve", "role_of",
           "use", "validate", "with_parts", "with_pending"]
