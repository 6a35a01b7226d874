"""Tiny PEFT LoRA adapters for the tests, made at test time with `peft` on a tiny random-weight base model."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: Path, out_dir: Path, *, r: int = 4, alpha: float = 8.0, seed: int = 0,
                 targets: list[str] | None = None, use_rslora: bool = False, std: float = 0.1) -> Path:
    """Save a PEFT LoRA adapter for the model at `base_dir` to `out_dir`, with random non-zero A and B (peft
    initialises B to zero, which would make the adapter a no-op)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS, lora_dropout=0.0,
                        use_rslora=use_rslora, bias="none")
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(out_dir)
    return out_dir


def merged_greedy(base_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], max_tokens: int
                  ) -> list[list[int]]:
    """Greedy tokens of each prompt alone, from transformers with the adapter merged by peft (None: the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model = model.eval()
    model.generation_config.eos_token_id = None
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            results.append(out[0, len(prompt):].tolist())
    return results
