"""Reading a PEFT LoRA adapter folder, and checking it against the base model before anything runs.

Mirrors vllm/lora/peft_helper.py (`PEFTHelper`: adapter_config.json, the `lora_alpha / r` scaling, rsLoRA's
`lora_alpha / sqrt(r)`, `validate_legal` against `max_lora_rank`) and the weight loading of
vllm/lora/lora_model.py (`LoRAModel.from_local_checkpoint`: adapter_model.safetensors, one `lora_A` / `lora_B`
pair per target module, the scaling folded into B once at load, as vLLM's `optimize()` does).

A folder holds `adapter_config.json` and `adapter_model.safetensors`; a target module's tensors are named
`base_model.model.model.layers.{i}.{self_attn|mlp}.{q|k|v|o|gate|up|down}_proj.lora_{A|B}.weight`, A of
shape `[r, in_features]`, B of shape `[out_features, r]`. `check_adapter` reads only the JSON and the
safetensors header (shapes, no weights), so the front end refuses a bad adapter before a request is queued.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections mini can wrap, and which sub-module of a decoder layer holds each.
TARGET_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                  "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")


@dataclass(frozen=True, slots=True)
class PEFTHelper:
    """What adapter_config.json says that mini uses (vLLM's `PEFTHelper` fields of the same names)."""

    r: int
    lora_alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        """`lora_alpha / r`, or rsLoRA's `lora_alpha / sqrt(r)` (vLLM: `PEFTHelper._scaling`)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def target_shapes(decoder_config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each wrappable projection of the base model (a `DecoderConfig`)."""
    hidden, inner = decoder_config.hidden_size, decoder_config.intermediate_size
    q_size = decoder_config.num_attention_heads * decoder_config.head_dim
    kv_size = decoder_config.num_key_value_heads * decoder_config.head_dim
    return {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, inner), "up_proj": (hidden, inner),
            "down_proj": (inner, hidden)}


def _refuse(name: str, path: str, why: str) -> ValueError:
    return ValueError(f"LoRA adapter {name!r} ({path}): {why}")


def read_peft_config(name: str, path: str) -> PEFTHelper:
    """adapter_config.json -> PEFTHelper; a ValueError naming the adapter and the field otherwise."""
    folder = Path(path)
    if not folder.is_dir():
        raise _refuse(name, path, "lora_path is not a folder (a PEFT adapter folder holds "
                      f"{CONFIG_FILE} and {WEIGHTS_FILE})")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / file).is_file():
            raise _refuse(name, path, f"missing {file} (a PEFT adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _refuse(name, path, f"{CONFIG_FILE} is not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise _refuse(name, path, f"{CONFIG_FILE} must hold a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise _refuse(name, path, f"peft_type must be 'LORA', got {raw.get('peft_type')!r}")
    r, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _refuse(name, path, f"{CONFIG_FILE} field 'r' must be an int >= 1, got {r!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _refuse(name, path, f"{CONFIG_FILE} field 'lora_alpha' must be a number, got {alpha!r}")
    for field_name, allowed in (("bias", (None, "none")), ("use_dora", (None, False)),
                                ("modules_to_save", (None, [])), ("rank_pattern", (None, {})),
                                ("alpha_pattern", (None, {}))):
        if raw.get(field_name) not in allowed:
            raise _refuse(name, path, f"{CONFIG_FILE} field {field_name!r} = {raw[field_name]!r} is not supported "
                          f"(allowed: {allowed})")
    targets = raw.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = [t for t in targets if t not in TARGET_MODULES]
    if unknown:
        raise _refuse(name, path, f"target_modules {unknown} are not supported; allowed: {sorted(TARGET_MODULES)}")
    return PEFTHelper(r=r, lora_alpha=float(alpha), use_rslora=bool(raw.get("use_rslora", False)),
                      target_modules=tuple(targets))


def _module_name(key: str, name: str, path: str) -> tuple[str, str, int]:
    """A tensor's key -> (module name `layers.{i}.{proj}`, "A" or "B", layer index)."""
    match = _KEY.match(key)
    if match is None or match.group(3) not in TARGET_MODULES or TARGET_MODULES[match.group(3)] != match.group(2):
        raise _refuse(name, path, f"tensor {key!r} is not a lora_A/lora_B weight of a supported module "
                      f"({sorted(TARGET_MODULES)})")
    layer = int(match.group(1))
    return f"layers.{layer}.{match.group(3)}", match.group(4), layer


def check_adapter(name: str, path: str, decoder_config: Any, max_lora_rank: int) -> PEFTHelper:
    """Refuse (ValueError naming the adapter and what is wrong) a folder the engine could not run.

    Checks the config, the rank against `max_lora_rank` (vLLM: `PEFTHelper.validate_legal`), and that every
    tensor's shape fits the base model's projection (an adapter trained for another base model does not).
    """
    from safetensors import SafetensorError, safe_open

    helper = read_peft_config(name, path)
    if helper.r > max_lora_rank:
        raise _refuse(name, path, f"LoRA rank {helper.r} is greater than max_lora_rank {max_lora_rank}")
    shapes = target_shapes(decoder_config)
    try:
        with safe_open(str(Path(path) / WEIGHTS_FILE), framework="pt") as handle:
            keys = list(handle.keys())
            found = {key: tuple(handle.get_slice(key).get_shape()) for key in keys}
    except (SafetensorError, OSError, ValueError) as error:
        raise _refuse(name, path, f"{WEIGHTS_FILE} cannot be read ({error})") from None
    if not found:
        raise _refuse(name, path, f"{WEIGHTS_FILE} holds no tensors")
    halves: dict[str, set[str]] = {}
    for key, shape in found.items():
        module, half, layer = _module_name(key, name, path)
        if layer >= decoder_config.num_hidden_layers:
            raise _refuse(name, path, f"tensor {key!r} is for layer {layer}, but the base model has "
                          f"{decoder_config.num_hidden_layers} layers (an adapter for another base model?)")
        in_features, out_features = shapes[module.rsplit(".", 1)[1]]
        want = (helper.r, in_features) if half == "A" else (out_features, helper.r)
        if shape != want:
            raise _refuse(name, path, f"tensor {key!r} has shape {list(shape)}, expected {list(want)} for this base "
                          f"model with r={helper.r} (an adapter for another base model?)")
        halves.setdefault(module, set()).add(half)
    lonely = sorted(module for module, got in halves.items() if got != {"A", "B"})
    if lonely:
        raise _refuse(name, path, f"modules {lonely} have only one of lora_A / lora_B")
    return helper


def load_adapter_weights(name: str, path: str, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32) -> tuple[PEFTHelper, dict[str, tuple[torch.Tensor,
                                                                                                  torch.Tensor]]]:
    """-> (config, {"layers.{i}.{proj}": (A `[r, in]`, scaling * B `[out, r]`)}) (vLLM: `LoRAModel`)."""
    from safetensors.torch import load_file

    helper = read_peft_config(name, path)
    tensors = load_file(str(Path(path) / WEIGHTS_FILE), device="cpu")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, half, _ = _module_name(key, name, path)
        pairs.setdefault(module, {})[half] = tensor
    weights = {}
    for module, pair in pairs.items():
        lora_a = pair["A"].to(device=device, dtype=torch.float32)
        lora_b = pair["B"].to(device=device, dtype=torch.float32) * helper.scaling
        weights[module] = (lora_a.to(dtype), lora_b.to(dtype))
    return helper, weights


class AdapterChecker:
    """The front end's check of each request's `LoRARequest`, each adapter read once (vLLM checks in
    `OpenAIServingModels.load_lora_adapter` / the input processor; mini checks here, before queueing).

    It also holds ids to one adapter each: a `lora_int_id` seen before with another name or path is refused,
    since the engine's slots, caches and prefix-cache hashes key on the id.
    """

    def __init__(self, decoder_config: Any, max_lora_rank: int) -> None:
        self.decoder_config = decoder_config
        self.max_lora_rank = max_lora_rank
        self.checked: dict[int, Any] = {}

    def check(self, lora_request: Any) -> None:
        from mini.lora.request import LoRARequest

        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a mini.lora.LoRARequest or None, got {type(lora_request).__name__}")
        known = self.checked.get(lora_request.lora_int_id)
        if known is not None:
            if known != lora_request:
                raise ValueError(f"lora_int_id {lora_request.lora_int_id} already names adapter "
                                 f"{known.lora_name!r} ({known.lora_path}); got {lora_request.lora_name!r} "
                                 f"({lora_request.lora_path}): give each adapter its own lora_int_id")
            return
        check_adapter(lora_request.lora_name, lora_request.lora_path, self.decoder_config, self.max_lora_rank)
        self.checked[lora_request.lora_int_id] = lora_request
