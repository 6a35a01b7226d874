"""Roles: the few places where the engine lets an implementation be chosen, resolved once when it is built.

Mirrors the idea behind vLLM's platform-chosen implementations: `CustomOp` (vllm/model_executor/custom_op.py)
picks `forward_native` or `forward_cuda` for an op, and the attention selector
(vllm/v1/attention/selector.py) picks a backend class, both when the model is built, never per call.
mini names its roles in the table below. Each role has a home: one or a few classes (the block pool,
the scheduler, the sampler, ...) whose *parts* are class attributes (methods, static functions, a nested
class, a Triton kernel). A part is what a course exercise writes.

    from mini import roles
    roles.ROLES                      # every role and its parts; importing `mini` imports no engine module
    roles.reference("touch")         # the engine's own implementation of a part

    choices = roles.choose({"touch": my_touch})     # what LLMEngine does once, at construction
    BlockPoolClass = choices.resolve(BlockPool)     # BlockPool itself, or a subclass with my_touch as `touch`

A home class with no part replaced is used as is (its fast paths are its default behaviour); with some
replaced, `resolve` returns a subclass built once whose `replaced_parts` names them, so a fast path that
fuses those parts is switched off when the object is built (`self.replaced_parts` is read in `__init__`,
never per call). A reference static function that calls a sibling part takes it as a keyword-only
parameter of the same name (`def subset_construction(nfa, *, epsilon_closure=epsilon_closure)`): when the
sibling is replaced, `resolve` binds the replacement there.

`use(**parts)` (what the course's `labs.plug` calls) makes parts the default choice of every engine
*built* inside the `with` block; an engine built outside it, or before it, keeps what it chose.
"""

from __future__ import annotations

import contextlib
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
          "mini.worker.input_batch:InputBatch": ("condense",)}),
    Role("model", "the decoder's own operators, and the classes of its layers that hold a tensor-parallel collective",
         {"mini.model.llama:LlamaForCausalLM": ("rms_norm", "apply_rotary", "RowParallelLinear",
                                                "VocabParallelEmbedding")}),
    Role("attention", "the attention backend: write K/V into the paged cache, attend over it",
         {"mini.attention.reference:ReferenceAttentionBackend": ("store_kv", "gather_kv", "paged_attention"),
          "mini.attention.triton_paged:TritonAttentionBackend": ("triton_store_kv", "paged_decode",
                                                                 "_store_kv_kernel", "_paged_decode_kernel")}),
    Role("sampler", "logits -> tokens: temperature, penalties, top-k/top-p, sampling, logprobs, logits processors, "
                    "rejection sampling of drafts",
         {"mini.sample.sampler:Sampler": ("apply_temperature", "apply_bad_words", "apply_all_penalties",
                                          "apply_top_k_top_p", "random_sample", "gather_logprobs"),
          "mini.sample.logits_processor.state:LogitsProcessors": ("process_dict_updates", "MinPLogitsProcessor",
                                                                   "LogitBiasLogitsProcessor",
                                                                   "MinTokensLogitsProcessor"),
          "mini.sample.rejection_sampler:RejectionSampler": ("compute_residual_probs", "rejection_sample")}),
    Role("drafter", "proposes draft tokens for speculative decoding",
         {"mini.spec_decode.ngram_proposer:NgramProposer": ("propose_ngram",),
          "mini.spec_decode.eagle:EagleProposer": ("prepare_eagle_inputs", "compute_draft_slots")}),
    Role("structured_output", "grammar -> token automaton -> per-step bitmask, and applying the mask",
         {"mini.structured_output.backend_mini:MiniGrammarCompiler": ("epsilon_closure", "subset_construction",
                                                                      "pack_allowed", "allowed_token_ids"),
          "mini.structured_output.bitmask:BitmaskApplier": ("apply_token_bitmask_inplace",)}),
    Role("detokenizer", "token ids -> text, a few bytes at a time, and stop strings",
         {"mini.engine.detokenizer:OffsetIncrementalDetokenizer": ("detokenize_incrementally",
                                                                   "check_stop_strings")}),
    Role("data_parallel", "which of N data-parallel engine cores takes a new request (least loaded)",
         {"mini.engine.dp_routing:DPLoadBalancer": ("get_core_engine_for_request",)}),
)

_ROLE_OF_PART: dict[str, Role] = {part: role for role in ROLES for part in role.parts}
_HOME_OF_PART: dict[str, str] = {part: home for role in ROLES for home, parts in role.homes.items()
                                 for part in parts}
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


def home_class(part: str) -> type:
    """The class whose attribute `part` is (imports its module on first use)."""
    role_of(part)
    module_name, class_name = _HOME_OF_PART[part].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def reference(part: str) -> Any:
    """The engine's own implementation of `part` (a function, a method's function, a class or a kernel)."""
    value = inspect.getattr_static(home_class(part), part)
    return value.__func__ if isinstance(value, staticmethod) else value


def _home_key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _validate(parts: Mapping[str, Any]) -> None:
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
    _validate(parts)
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


@dataclass(frozen=True)
class Choices:
    """What an engine chose, once, when it was built: the replaced parts, and the classes they make."""

    parts: Mapping[str, Any] = field(default_factory=dict)
    _classes: dict[str, type] = field(default_factory=dict, repr=False, compare=False)

    def replaced(self, role: str) -> tuple[str, ...]:
        """The parts of `role` this engine replaces (empty: the role runs its default implementation)."""
        return tuple(part for part in self.parts if _ROLE_OF_PART[part].name == role)

    def resolve(self, cls: type) -> type:
        """`cls` itself when none of its parts is replaced, else a subclass (built once) that holds them."""
        key = _home_key(cls)
        mine = {part: value for part, value in self.parts.items() if _HOME_OF_PART[part] == key}
        if not mine:
            return cls
        if key not in self._classes:
            self._classes[key] = with_parts(cls, mine)
        return self._classes[key]


DEFAULT = Choices()


def choose(parts: Mapping[str, Any] | None = None) -> Choices:
    """The choices of an engine being built: the parts of enclosing `use` blocks, then `parts` on top."""
    chosen = pending()
    if parts:
        _validate(parts)
        chosen.update(parts)
    return Choices(dict(chosen)) if chosen else DEFAULT


def with_parts(cls: type, parts: Mapping[str, Any]) -> type:
    """A subclass of home class `cls` with `parts` in place of its own (static parts stay static)."""
    attributes: dict[str, Any] = {"replaced_parts": frozenset(parts), "__module__": cls.__module__}
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


__all__ = ["DEFAULT", "ROLES", "Choices", "Role", "choose", "home_class", "part_names", "reference",
           "role_of", "use", "with_parts"]
