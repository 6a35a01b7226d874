"""The worker's adapters: a CPU cache of loaded adapters, `max_loras` GPU slots, and the per-step mapping.

Mirrors vllm/lora/model_manager.py (`LoRAModelManager`: wraps the target modules in LoRA layers at start-up,
`activate_adapter` copies an adapter into a free slot) and vllm/lora/worker_manager.py
(`LRUCacheWorkerLoRAManager`: `max_cpu_loras` adapters kept loaded on the host, least recently used evicted;
`set_active_adapters` each step), with vllm/v1/worker/lora_model_runner_mixin.py's `set_active_loras`: the
model runner hands over each row's adapter and scheduled token count, and every token gets its row's slot.

Slots are kept across steps: an adapter already in a slot is not copied again, and a slot is taken back only
when a new adapter needs one, from the least recently used adapter not in this step (the scheduler never puts
more than `max_loras` distinct adapters in a step, so there always is one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from mini import roles
from mini.lora.layers import LinearWithLoRA, SharedShrink
from mini.lora.peft_helper import TARGET_MODULES, load_adapter_weights, target_shapes
from mini.lora.punica_wrapper import PunicaWrapper
from mini.lora.request import LoRARequest

# Projections that read the same input (LlamaAttention: q/k/v of the normed hidden state; LlamaMLP: gate/up).
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def default_lora_backend(device: torch.device | str) -> str:
    """Triton on CUDA (when installed), the torch ops elsewhere."""
    if str(device).startswith("cuda"):
        try:
            import triton  # noqa: F401
            return "triton"
        except ImportError:
            return "torch"
    return "torch"


class LoRAModelManager:
    """Wraps `model`'s projections; `set_active_loras(row_loras, num_scheduled_tokens)` before each forward."""

    def __init__(self, model: Any, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
                 backend: str | None = None, config: Any = None) -> None:
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.max_loras, self.max_lora_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        # the model role's punica parts (mini/roles.py): the fast wrapper, or the reference one with parts replaced
        self.punica = roles.resolve(config, PunicaWrapper)(backend or default_lora_backend(self.device), max_loras,
                                                           max_lora_rank)
        self.modules: dict[str, LinearWithLoRA] = {}
        shapes = target_shapes(model.config)
        for index, layer in enumerate(model.model.layers):
            # q/k/v read one input, gate/up another: each set shares one shrink per stacked step
            shared = {group: SharedShrink(len(group), max_loras, max_lora_rank, shapes[group[0]][0], self.device,
                                          self.dtype) for group in SHARED_INPUTS}
            for proj, parent_name in TARGET_MODULES.items():
                parent = getattr(layer, parent_name)
                in_features, out_features = shapes[proj]
                group = next((g for g in SHARED_INPUTS if proj in g), None)
                wrapped = LinearWithLoRA(getattr(parent, proj), in_features, out_features, max_loras, max_lora_rank,
                                         self.punica, self.device, self.dtype,
                                         shared=None if group is None else shared[group],
                                         member=0 if group is None else group.index(proj))
                setattr(parent, proj, wrapped)
                self.modules[f"layers.{index}.{proj}"] = wrapped
        # lora_int_id -> (request, weights), least recently used first (vLLM: the worker manager's LRU cache).
        self.cpu_cache: OrderedDict[int, tuple[LoRARequest, dict]] = OrderedDict()
        # lora_int_id -> slot, least recently used first.
        self.slots: OrderedDict[int, int] = OrderedDict()
        self.num_loads = 0   # adapters read from disk (tests and the bench look at it)

    def _weights(self, lora_request: LoRARequest) -> dict:
        """The adapter's weights from the CPU cache, read from its folder on a miss (evicting the LRU)."""
        lora_id = lora_request.lora_int_id
        if lora_id in self.cpu_cache:
            self.cpu_cache.move_to_end(lora_id)
            return self.cpu_cache[lora_id][1]
        _, weights = load_adapter_weights(lora_request.lora_name, lora_request.lora_path, "cpu", self.dtype)
        self.num_loads += 1
        while len(self.cpu_cache) >= self.max_cpu_loras:
            self.cpu_cache.popitem(last=False)
        self.cpu_cache[lora_id] = (lora_request, weights)
        return weights

    def _activate(self, lora_request: LoRARequest, in_use: set[int]) -> int:
        """The slot of `lora_request`, copying it into a free (or the LRU unused) slot when needed."""
        lora_id = lora_request.lora_int_id
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return self.slots[lora_id]
        weights = self._weights(lora_request)
        taken = set(self.slots.values())
        free = [slot for slot in range(self.max_loras) if slot not in taken]
        if free:
            slot = free[0]
        else:
            victim = next((other for other in self.slots if other not in in_use), None)
            if victim is None:
                raise RuntimeError(f"more than max_loras={self.max_loras} adapters in one step")
            slot = self.slots.pop(victim)
        for name, module in self.modules.items():
            pair = weights.get(name)
            if pair is None:
                module.reset_lora(slot)
            else:
                module.set_lora(slot, pair[0].to(self.device), pair[1].to(self.device))
        self.slots[lora_id] = slot
        return slot

    def set_active_loras(self, row_loras: Sequence[LoRARequest | None], num_scheduled_tokens: Sequence[int]) -> None:
        """Give every token of row i the slot of `row_loras[i]` (-1 for none) for the coming forward."""
        wanted = {lora.lora_int_id: lora for lora in row_loras if lora is not None}
        if not wanted:
            self.punica.set_mapping(None)
            return
        if len(wanted) > self.max_loras:
            raise RuntimeError(f"{len(wanted)} adapters in one step, more than max_loras={self.max_loras}")
        for lora in wanted.values():
            self._activate(lora, set(wanted))
        lora_index_to_id: list[int | None] = [None] * self.max_loras   # slot -> adapter id (vLLM's name)
        for lora_id, slot in self.slots.items():
            lora_index_to_id[slot] = lora_id
        req_lora_ids = torch.tensor([0 if lora is None else lora.lora_int_id for lora in row_loras], dtype=torch.int64)
        self.punica.update_metadata(req_lora_ids, torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int64),
                                    lora_index_to_id, self.device)

    def clear_mapping(self) -> None:
        self.punica.set_mapping(None)
