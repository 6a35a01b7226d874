"""`LoRARequest`: which adapter a request runs with.

Mirrors vllm/lora/request.py (`LoRARequest`): the same three fields a user fills in. `lora_int_id` is the
adapter's identity inside the engine (GPU slots, the CPU cache, the prefix-cache hash and the scheduler's
`max_loras` count all key on it), so two requests naming the same id must mean the same adapter; as in vLLM
it must be >= 1 (0 stands for "no adapter"). vLLM's request is a `msgspec.Struct`; mini's is a frozen
dataclass, which msgspec encodes as a dict and mini/serial_utils.py rebuilds in the engine-core process.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """`LoRARequest(lora_name, lora_int_id, lora_path)`: a PEFT adapter folder and the id it runs under."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty str, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an int >= 1 (0 means no adapter), "
                             f"got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest.lora_path must name a PEFT adapter folder, got {self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
