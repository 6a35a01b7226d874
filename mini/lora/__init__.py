"""LoRA: many adapters in one batch (mirrors vllm/lora/).

`LoRARequest` (request.py) names an adapter; peft_helper.py reads and checks a PEFT folder; layers.py wraps
the projections; punica_wrapper.py and ops/ add each token's adapter; model_manager.py keeps the CPU cache
and the GPU slots. docs/lora.md walks through it.
"""

from mini.lora.request import LoRARequest

__all__ = ["LoRARequest"]
