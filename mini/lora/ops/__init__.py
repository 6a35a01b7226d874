"""LoRA's two batched matmuls, `shrink` (x @ A^T, down to the rank) and `expand` (@ B^T, back up, added to the
base layer's output), over a batch whose tokens use different adapters. Mirrors vllm/lora/ops/: the torch
version (vllm/lora/ops/torch_ops/lora_ops.py) and the Triton kernels (vllm/lora/ops/triton_ops/)."""
