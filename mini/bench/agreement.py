"""`python -m mini bench agreement`: greedy tokens of mini against transformers' `generate()` at one precision.

Mirrors no vLLM file (vLLM checks this in its tests, tests/models/ compares with transformers' outputs). The 8
prompts are those of tests/model/test_smollm2.py (plain text, code, chat-templated questions). transformers runs
each prompt alone (no padding) from the same model folder at `--dtype`; mini runs them as one batch, with
`--quantization` if given (transformers then holds the float values the scheme starts from: for `gguf`, the
file's dequantized blocks). Greedy decoding at bfloat16 is fragile by nature: two correct implementations that sum
in a different order split at the first near-tie of the two best logits, and every token after that differs.

Prints one line per prompt (`same` or the first position that differs) and, last,
`greedy_identical=X/8 first_divergence=[...]` (None: identical through `--max-tokens`).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

PLAIN_PROMPTS = ("The three primary colors are", "Once upon a time, in a small village by the sea,",
                 "Water boils at a temperature of")
CODE_PROMPTS = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                "import json\n\ndef load_config(path):\n")
CHAT_QUESTIONS = ("What is the capital of France?", "Write a haiku about the ocean.",
                  "Give me three tips for learning Python.")


def prompt_token_ids(tokenizer) -> list[list[int]]:
    """The 8 prompts as token ids (the questions through the chat template when the tokenizer has one)."""
    if getattr(tokenizer, "chat_template", None):
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                               add_generation_prompt=True) for q in CHAT_QUESTIONS]
    else:
        chats = list(CHAT_QUESTIONS)
    return [tokenizer.encode(text, add_special_tokens=False) for text in (*PLAIN_PROMPTS, *CODE_PROMPTS, *chats)]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where the two token lists differ (None: equal)."""
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def transformers_greedy(model_dir: str, dtype: str, prompts: list[list[int]], max_tokens: int,
                        pad_token_id: int | None) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_token_id)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m mini bench agreement", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="as LLM(model=...) (default: the shipped tiny model)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--quantization", default=None, help="mini's scheme (transformers keeps the float values)")
    parser.add_argument("--max-tokens", type=int, default=20)
    args = parser.parse_args(argv)
    from mini import LLM, SamplingParams
    from mini.bench.workload import machine_line

    llm = LLM(model=args.model, dtype=args.dtype, quantization=args.quantization)
    tokenizer = llm.get_tokenizer()
    prompts = prompt_token_ids(tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    mini_out = [out.outputs[0].token_ids for out in
                llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
    model_dir = str(llm.llm_engine.config.model_dir)
    del llm
    hf_out = transformers_greedy(model_dir, args.dtype, prompts, args.max_tokens, tokenizer.eos_token_id)
    print(machine_line(torch.get_num_threads(), "cpu"))
    print(f"model {args.model or 'the shipped tiny model'}, mini {args.dtype} quantization={args.quantization} "
          f"against transformers {args.dtype}, {args.max_tokens} greedy tokens per prompt")
    divergences = []
    for index, (mine, theirs) in enumerate(zip(mini_out, hf_out, strict=True)):
        position = first_divergence(list(mine), list(theirs))
        divergences.append(position)
        print(f"prompt {index}: {'same' if position is None else f'first differs at token {position}'}")
    same = sum(position is None for position in divergences)
    print(f"greedy_identical={same}/{len(prompts)} first_divergence={divergences}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
