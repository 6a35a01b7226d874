"""Engine configuration: every knob of `LLM(...)` in one validated dataclass.

Mirrors vllm/config/ (CacheConfig, SchedulerConfig, ModelConfig), collapsed into one small dataclass:
vLLM spreads these over several config classes joined in `VllmConfig`; a single-process teaching engine
needs only the fields below, with the same names as vLLM's engine arguments (vllm/engine/arg_utils.py).

The fields are the one list of engine arguments: `LLM(model, **engine_args)` checks its keywords against
them (`engine_config_from_args`), and the command lines build their flags from them (`add_engine_arguments`:
name, default, help and choices from each field's metadata), as vLLM's `EngineArgs.add_cli_args` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mini import roles
from mini.attention import ATTENTION_BACKEND_MODULES
from mini.compilation import (
    CompilationMode,
    CompilationSettings,
    parse_compilation_config,
    parse_compilation_mode,
)
from mini.core.sched.request_queue import SchedulingPolicy
from mini.model.quantization import QUANTIZATION_METHODS, check_quantization_args
from mini.model.registry import SHIPPED_MODEL_DIR, resolve_model_dir
from mini.spec_decode.config import SpeculativeConfig

SHIPPED_DRAFT_MODEL_DIR = SHIPPED_MODEL_DIR.parent / "tiny-llama-draft"  # beside the shipped model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SCHEDULING_POLICIES = tuple(policy.value for policy in SchedulingPolicy)
ATTENTION_BACKENDS = tuple(ATTENTION_BACKEND_MODULES)
PREFIX_CACHING_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")  # vLLM: vllm/config/cache.py

# Default KV budget when num_gpu_blocks_override is None: enough blocks for every sequence slot at
# full length, capped so a big max_model_len on a laptop does not allocate gigabytes up front.
DEFAULT_KV_CACHE_BYTES = 512 * 1024 * 1024


@dataclass
class EngineConfig:
    """The engine arguments `LLM(...)` accepts (names as in vLLM's EngineArgs)."""

    model: str | None = field(default=None, metadata={
        "help": "local HF folder, .gguf file or offline hub id (default: the shipped tiny model)"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block"})
    max_num_seqs: int = field(default=64, metadata={"help": "most requests running in one step"})
    max_num_batched_tokens: int = field(default=512, metadata={"help": "most tokens scheduled in one step"})
    max_model_len: int | None = field(default=None, metadata={
        "help": "longest prompt + output, in tokens (default: the model's max_position_embeddings)"})
    enable_chunked_prefill: bool = field(default=True, metadata={
        "help": "split a long prompt's prefill over several steps"})
    long_prefill_token_threshold: int = field(default=0, metadata={
        "help": "most prefill tokens one request gets per step (0: no cap)"})
    enable_prefix_caching: bool = field(default=False, metadata={
        "help": "reuse the KV blocks of a prompt prefix already computed"})
    prefix_caching_hash_algo: str = field(default="sha256", metadata={
        "help": "block hash (vLLM's default sha256; the *_cbor / xxhash ones need cbor2 / xxhash)",
        "choices": PREFIX_CACHING_HASH_ALGOS})
    scheduling_policy: str = field(default="fcfs", metadata={
        "help": "the waiting queue's order", "choices": SCHEDULING_POLICIES})
    num_gpu_blocks_override: int | None = field(default=None, metadata={
        "help": "KV blocks in the pool, the null block included (default: sized at start-up)"})
    # KV-cache budget (mini/worker/startup.py `determine_num_kv_blocks`): bytes for the KV cache, or on CUDA
    # the fraction of the GPU's memory the engine may use (weights + activations + KV), as vLLM's.
    kv_cache_memory_bytes: int | None = field(default=None, metadata={
        "help": "bytes of KV cache (default: sized at start-up, mini/worker/startup.py)"})
    gpu_memory_utilization: float = field(default=0.92, metadata={   # vLLM v0.33.0 CacheConfig default
        "help": "on CUDA: the fraction of the GPU's memory the engine may use (weights + activations + KV)"})
    skip_tokenizer_init: bool = field(default=False, metadata={
        "help": "load no tokenizer (prompts must be token ids; outputs carry no text)"})
    attention_backend: str | None = field(default=None, metadata={
        "help": "attention implementation (default: torch_fast on CPU, triton on CUDA)",
        "choices": ATTENTION_BACKENDS})
    # CUDA graphs for decode steps (mini/worker/cuda_graph.py; vllm/config/compilation.py): captured at start-up
    # on CUDA with the triton backend unless `enforce_eager`, for the batch sizes `cudagraph_capture_sizes`
    # (powers of two below `max_cudagraph_capture_size`, plus it; None: min(max_num_seqs, 512)). CPU runs eager.
    enforce_eager: bool = field(default=False, metadata={
        "help": "no CUDA graphs for decode (default: captured at start-up on CUDA; CPU always runs eager)"})
    max_cudagraph_capture_size: int | None = field(default=None, metadata={
        "help": "largest decode batch captured as a CUDA graph (default: min(max_num_seqs, 512))"})
    # torch.compile of the model's forward (mini/compilation.py): an int mode or {"mode": N, "splitting_ops": [...]},
    # as vLLM's compilation_config; None or 0: eager (mini's default), 3: traced once, attention an opaque op, the
    # pieces between attention calls compiled by inductor (splitting_ops=[]: one inductor graph).
    compilation_config: int | dict | None = field(default=None, metadata={
        "help": "torch.compile of the forward: a mode (0: eager, 3: compiled) or JSON "
                "{\"mode\": N, \"splitting_ops\": []} (default: split at attention; []: one graph)"})
    device: str = field(default="cpu", metadata={"help": "'cpu' or 'cuda[:N]'"})
    dtype: str = field(default="float32", metadata={"help": "weights and activations", "choices": tuple(DTYPES)})
    seed: int = field(default=0, metadata={"help": "the engine's random seed"})
    # Quantized weights (mini/model/quantization/, vLLM's names); a checkpoint's quantization_config is read too.
    quantization: str | None = field(default=None, metadata={
        "help": "weight quantization scheme (default: the checkpoint's, else none)", "choices": QUANTIZATION_METHODS})
    # Tensor parallelism (mini/executor/multiproc_executor.py, mini/model/parallel_linear.py): one worker process
    # per rank, gloo on the CPU, NCCL on CUDA (rank r on cuda:r). The heads must divide: checked at start-up.
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "worker processes the model's layers are split over (tensor parallelism)"})
    logits_processors: list = field(default_factory=list, metadata={
        "help": "custom LogitsProcessor classes (Python only)", "cli": False})
    # Data parallelism (mini/engine/dp_client.py): N engine cores behind one AsyncLLM front end (the server),
    # each request routed to the least-loaded core (mini/engine/dp_routing.py). Offline `LLM` refuses N > 1.
    data_parallel_size: int = field(default=1, metadata={
        "help": "engine-core processes behind one server, requests routed to the least loaded (data parallelism)"})
    # Speculative decoding, as vLLM's `speculative_config` dict (mini/spec_decode/config.py); parsed into a
    # SpeculativeConfig here, so after construction it is a SpeculativeConfig or None.
    speculative_config: dict | SpeculativeConfig | None = field(default=None, metadata={
        "help": "speculative decoding, as vLLM's: JSON, e.g. '{\"method\": \"ngram\", "
                "\"num_speculative_tokens\": 3}' (methods: ngram, draft_model, eagle)"})
    # Async scheduling (`EngineCore.step_with_batch_queue`, mini/engine/core.py): step N+1 is scheduled while
    # step N runs; vLLM's default is on, mini's off (`validate_async_scheduling` below says why and what it refuses).
    async_scheduling: bool = field(default=False, metadata={
        "help": "schedule the next step while the model runs this one (vLLM's async scheduling)"})
    # The course's replaced parts (mini/roles.py), part name -> implementation: what `labs.plug` sets for an
    # engine built inside its block. Each component resolves its class from it where it is built
    # (`roles.resolve(config, Scheduler)`), as vLLM's `scheduler_cls` and `logits_processors` name classes.
    parts: dict = field(default_factory=dict, repr=False, metadata={
        "help": "replaced parts of the engine's roles (mini/roles.py; set by labs.plug)", "cli": False,
        "engine_arg": False})
    # LoRA adapters (mini/lora/, vllm/config/lora.py `LoRAConfig`): requests name a PEFT adapter folder
    # (`LoRARequest`); at most `max_loras` distinct adapters run in one step, `max_cpu_loras` stay loaded on the host.
    enable_lora: bool = field(default=False, metadata={"help": "serve LoRA adapters (requests carry a LoRARequest)"})
    max_loras: int = field(default=1, metadata={"help": "most distinct LoRA adapters in one step (GPU slots)"})
    max_lora_rank: int = field(default=16, metadata={"help": "largest LoRA rank an adapter may have"})
    max_cpu_loras: int | None = field(default=None, metadata={
        "help": "LoRA adapters kept loaded on the host, >= max_loras (default: max_loras)"})

    def __post_init__(self) -> None:  # noqa: C901 - a flat list of field checks, as vLLM's config validation
        self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        roles.validate(self.parts)
        if self.speculative_config is not None and self.logits_processors:
            raise ValueError("speculative_config cannot be combined with custom logits_processors: a processor "
                             "sees one position per row, while verification scores k + 1 positions at once")
        validate_async_scheduling(self)
        validate_lora(self)
        self._check_positive_int("block_size", self.block_size)
        self._check_positive_int("max_num_seqs", self.max_num_seqs)
        self._check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        self._check_positive_int("tensor_parallel_size", self.tensor_parallel_size)
        self._check_positive_int("data_parallel_size", self.data_parallel_size)
        if self.tensor_parallel_size > 1 and self.speculative_config is not None:
            raise ValueError("speculative_config is not supported with tensor_parallel_size > 1 in mini "
                             "(the drafters run unsharded in one process)")
        if self.max_model_len is not None:
            self._check_positive_int("max_model_len", self.max_model_len)
        if not isinstance(self.long_prefill_token_threshold, int) or self.long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be an int >= 0 (0 = no cap), "
                f"got {self.long_prefill_token_threshold!r}"
            )
        if self.prefix_caching_hash_algo not in PREFIX_CACHING_HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {PREFIX_CACHING_HASH_ALGOS}, "
                             f"got {self.prefix_caching_hash_algo!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}"
            )
        if self.num_gpu_blocks_override is not None and (
            not isinstance(self.num_gpu_blocks_override, int) or self.num_gpu_blocks_override < 2
        ):
            raise ValueError(
                "num_gpu_blocks_override must be an int >= 2 (block 0 is the null block), "
                f"got {self.num_gpu_blocks_override!r}"
            )
        if self.kv_cache_memory_bytes is not None and (
            not isinstance(self.kv_cache_memory_bytes, int) or isinstance(self.kv_cache_memory_bytes, bool)
            or self.kv_cache_memory_bytes < 1
        ):
            raise ValueError("kv_cache_memory_bytes must be a positive int or None, "
                             f"got {self.kv_cache_memory_bytes!r}")
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be a float in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS} or None, got {self.attention_backend!r}"
            )
        if self.enforce_eager is not True and self.enforce_eager is not False:
            raise ValueError(f"enforce_eager must be a bool (True or False), got {self.enforce_eager!r}")
        if self.max_cudagraph_capture_size is not None and (
            not isinstance(self.max_cudagraph_capture_size, int) or isinstance(self.max_cudagraph_capture_size, bool)
            or not 1 <= self.max_cudagraph_capture_size <= self.max_num_seqs
        ):
            raise ValueError(
                f"max_cudagraph_capture_size must be None or an int in [1, max_num_seqs={self.max_num_seqs}] "
                f"(a decode batch never holds more than max_num_seqs requests), got {self.max_cudagraph_capture_size!r}"
            )
        mode = parse_compilation_mode(self.compilation_config)   # a bad value raises ValueError naming the modes
        if mode != CompilationMode.NONE and self.tensor_parallel_size > 1:
            raise ValueError(f"compilation_config mode {int(mode)} is not supported with tensor_parallel_size > 1 "
                             "in mini (its collectives are not traceable); use compilation_config=0")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        check_quantization_args(self.quantization, self.device, self.tensor_parallel_size)
        if not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")
        if self.device != "cpu" and not str(self.device).startswith("cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} requested but CUDA is not available; use device='cpu'")
        if (not self.enable_chunked_prefill and self.max_model_len is not None
                and self.max_num_batched_tokens < self.max_model_len):
            raise ValueError(
                    "with enable_chunked_prefill=False, max_num_batched_tokens "
                    f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
                )

    @property
    def compilation_mode(self) -> CompilationMode:
        return self.compilation_settings.mode

    @property
    def compilation_settings(self) -> CompilationSettings:
        return parse_compilation_config(self.compilation_config)

    @staticmethod
    def _check_positive_int(name: str, value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def model_dir(self) -> Path:
        """The local folder the weights come from: the shipped tiny model when `model` is None, a local HF
        folder, or the cached conversion of a .gguf file or of a hub id available offline
        (mini/model/registry.py; a GGUF is converted once, on first use)."""
        return resolve_model_dir(self.model)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def cudagraph_capture_sizes(self) -> list[int]:
        """Decode batch sizes to capture, ascending: the powers of two below the cap, then the cap itself
        (cap: `max_cudagraph_capture_size`, None -> min(max_num_seqs, 512)); e.g. cap 12 -> [1, 2, 4, 8, 12].
        vLLM: `CompilationConfig.cudagraph_capture_sizes`, bounded by `max_cudagraph_capture_size`."""
        cap = self.max_cudagraph_capture_size
        if cap is None:
            cap = min(self.max_num_seqs, 512)
        return [1 << power for power in range(cap.bit_length()) if 1 << power < cap] + [cap]

    def resolved_attention_backend(self) -> str:
        """torch_fast on CPU, triton on CUDA, unless asked for explicitly ("torch" = phase 03's reference)."""
        if self.attention_backend is not None:
            return self.attention_backend
        return "triton" if str(self.device).startswith("cuda") else "torch_fast"


# ---------------------------------------------------------------------------- engine arguments
# `parts` is set by the course (labs.plug, through mini.roles), never passed to `LLM(...)`: not an engine argument.
ENGINE_ARG_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EngineConfig)
                                          if f.metadata.get("engine_arg", True))


def engine_config_from_args(**engine_args: Any) -> EngineConfig:
    """`EngineConfig(**engine_args)`, refusing a name that is not an engine argument with the list of those."""
    unknown = [name for name in engine_args if name not in ENGINE_ARG_NAMES]
    if unknown:
        raise TypeError(f"unknown engine argument(s) {', '.join(map(repr, unknown))}; the engine arguments "
                        f"are: {', '.join(ENGINE_ARG_NAMES)}")
    if engine_args.get("logits_processors") is None:   # LLM(logits_processors=None): none, as vLLM's
        engine_args.pop("logits_processors", None)
    else:
        engine_args["logits_processors"] = list(engine_args["logits_processors"])
    return EngineConfig(**engine_args)


def _cli_type(config_field: dataclasses.Field) -> Callable[[str], Any] | None:
    """How a flag's text becomes the field's value, from its annotation (None: a bool switch)."""
    annotation = str(config_field.type)
    if "dict" in annotation:
        return json.loads          # '{"method": "ngram"}'; a bare 3 reads as the int 3
    for prefix, convert in (("bool", None), ("int", int), ("float", float), ("str", str)):
        if annotation.startswith(prefix):
            return convert
    raise TypeError(f"EngineConfig.{config_field.name}: no command-line form for {annotation!r}")


def add_engine_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> argparse.ArgumentParser:
    """Add a `--flag-name` per engine argument in `names`: default, help and choices from its field.

    A bool field defaulting to False is a switch (`--enable-prefix-caching`); one defaulting to True takes
    `--x` / `--no-x`. The values land under the field's name (`args.max_num_seqs`): `cli_engine_args`.
    """
    by_name = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for name in names:
        config_field = by_name[name]
        if config_field.metadata.get("cli") is False:
            raise ValueError(f"EngineConfig.{name} has no command-line form")
        flag = "--" + name.replace("_", "-")
        help_text = config_field.metadata.get("help", "")
        convert = _cli_type(config_field)
        if convert is None:
            action = "store_true" if config_field.default is False else argparse.BooleanOptionalAction
            parser.add_argument(flag, dest=name, action=action, default=config_field.default, help=help_text)
            continue
        parser.add_argument(flag, dest=name, type=convert, default=config_field.default,
                            choices=config_field.metadata.get("choices"),
                            help=help_text if "default" in help_text else f"{help_text} (default: %(default)s)")
    return parser


def cli_engine_args(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The engine arguments `names` out of parsed command-line `args`."""
    return {name: getattr(args, name) for name in names}


# Which engines may run with async scheduling (vLLM: the async-scheduling checks in `VllmConfig.__post_init__`,
# vllm/config/vllm.py).
#
# vLLM v0.33.0 turns `async_scheduling` on by default (`None` -> True) unless something it cannot overlap is
# configured, and raises when it is asked for explicitly with one: pipeline parallelism and, on its V1 model
# runner, speculative decoding other than EAGLE / draft-model / GPU n-gram (so the CPU `ngram` proposer is
# refused). mini's default is False: on a CPU the forward and the host work share the same few cores, so the
# overlap buys little there (mini/bench/async_scheduling.py measures it), and the course's step-by-step views
# want one step at a time. mini refuses every speculative method with it: its drafts come back through the
# scheduler after each step (`ModelRunnerOutput.spec_token_ids`), which a step scheduled before that output
# cannot have; vLLM keeps them on the worker instead. mini has no pipeline parallelism.
def validate_async_scheduling(config: Any) -> None:
    """Raise ValueError, naming the fields, for a combination async scheduling cannot keep exact."""
    value = config.async_scheduling
    if value is not True and value is not False:
        raise ValueError(f"async_scheduling must be a bool (True or False), got {value!r}")
    if not value:
        return
    spec = config.speculative_config
    if spec is not None:
        raise ValueError(
            f"async_scheduling=True cannot be combined with speculative_config (method {spec.method!r}): the "
            "drafts of step N reach the scheduler only after step N, and with async scheduling step N+1 is "
            "scheduled before that (vLLM refuses 'ngram' too); use async_scheduling=False")
    if int(getattr(config, "pipeline_parallel_size", 1) or 1) > 1:
        raise ValueError("async_scheduling=True cannot be combined with pipeline_parallel_size > 1 (as vLLM's "
                         "V1 model runner)")


def validate_lora(config: Any) -> None:
    """The LoRA fields (vLLM: `LoRAConfig.__post_init__` and `verify_with_model_config`), and what mini cannot
    combine with LoRA yet; `max_cpu_loras` None becomes `max_loras`, as vLLM's."""
    if config.enable_lora is not True and config.enable_lora is not False:
        raise ValueError(f"enable_lora must be a bool (True or False), got {config.enable_lora!r}")
    for name in ("max_loras", "max_lora_rank"):
        EngineConfig._check_positive_int(name, getattr(config, name))
    if config.max_cpu_loras is None:
        config.max_cpu_loras = config.max_loras
    EngineConfig._check_positive_int("max_cpu_loras", config.max_cpu_loras)
    if config.max_cpu_loras < config.max_loras:
        raise ValueError(f"max_cpu_loras ({config.max_cpu_loras}) must be >= max_loras ({config.max_loras})")
    if not config.enable_lora:
        return
    refused = {"tensor_parallel_size": config.tensor_parallel_size > 1,
               "data_parallel_size": config.data_parallel_size > 1,
               "speculative_config": config.speculative_config is not None,
               "compilation_config": parse_compilation_mode(config.compilation_config) != CompilationMode.NONE}
    for name, is_set in refused.items():
        if is_set:
            raise ValueError(f"enable_lora=True cannot be combined with {name}={getattr(config, name)!r} in mini "
                             "(LoRA runs unsharded, in one eager model); leave it at its default")
