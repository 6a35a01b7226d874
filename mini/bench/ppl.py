"""`python -m mini bench ppl`: perplexity of each weight precision on a held-out English text.

Mirrors no vLLM file (vLLM measures accuracy with external harnesses such as lm-eval). The text is
mini/assets/heldout_english.txt, about 4.6 KB of plain English written for mini (no copyrighted source, never
seen by either model in training as far as anyone can know). It is cut into windows of `--window` tokens, each
scored on its own; the perplexity is exp(mean negative log-likelihood) over every token after a window's first.

mini scores a window through the engine (`SamplingParams(prompt_logprobs=0)`: the log-probability of each prompt
token given the ones before it), once per scheme:
    float32, bfloat16                      the float weights at that precision
    int8  (int8_per_channel_weight_only)   int8 weights, a scale per output row, bfloat16 activations
    int4  (gptq, group 32)                 4-bit weights rounded to nearest in groups of 32, bfloat16 activations
    w8a8  (int8_per_token)                 int8 weights per row and int8 activations per token (torch._int_mm)
    gguf  (gguf)                           a GGUF model's own blocks (SmolLM2: Q4_1 layers, Q8_0 head), bfloat16;
                                           only with `--schemes ... gguf` and a GGUF model
`--transformers` adds transformers' own float32 and bfloat16 scores of the same windows (the reference the
float rows should match). Last line: `ppl_ratio_vs_float32 <scheme>=X.XXX ...` (1.000: no loss).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

HELDOUT_TEXT = Path(__file__).resolve().parents[1] / "assets" / "heldout_english.txt"
SCHEMES = {   # label: (dtype, quantization)
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "int8": ("bfloat16", "int8_per_channel_weight_only"),
    "int4": ("bfloat16", "gptq"),
    "gguf": ("bfloat16", "gguf"),
    "w8a8": ("bfloat16", "int8_per_token"),
}
DEFAULT_SCHEMES = ("float32", "bfloat16", "int8", "w8a8", "int4")   # gguf needs a GGUF model: asked for by name


def windows_of(token_ids: list[int], window: int) -> list[list[int]]:
    """Consecutive windows of `window` tokens (the last one shorter, dropped under 2 tokens)."""
    pieces = [token_ids[start:start + window] for start in range(0, len(token_ids), window)]
    return [piece for piece in pieces if len(piece) >= 2]


def mini_nll(model: str | None, dtype: str, quantization: str | None, windows: list[list[int]]) -> tuple[float, int]:
    """Sum of negative log-likelihoods of every token after each window's first, and how many."""
    from mini import LLM, SamplingParams

    longest = max(len(w) for w in windows)
    llm = LLM(model=model, dtype=dtype, quantization=quantization, max_model_len=longest + 8,
              max_num_batched_tokens=max(512, longest), skip_tokenizer_init=True)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
    total, count = 0.0, 0
    for window, output in zip(windows, outputs, strict=True):
        for position in range(1, len(window)):
            total -= output.prompt_logprobs[position][window[position]].logprob
            count += 1
    return total, count


def transformers_nll(model_dir: str, dtype: str, windows: list[list[int]]) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for window in windows:
            ids = torch.tensor([window])
            logprobs = hf_model(ids).logits[0, :-1].float().log_softmax(-1)
            total -= float(logprobs.gather(1, ids[0, 1:, None]).sum())
            count += len(window) - 1
    return total, count


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m mini bench ppl", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="as LLM(model=...) (default: the shipped tiny model)")
    parser.add_argument("--window", type=int, default=256, help="tokens per scored window")
    parser.add_argument("--schemes", nargs="+", default=list(DEFAULT_SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--transformers", action="store_true", help="also transformers' float32 and bfloat16")
    args = parser.parse_args(argv)
    from mini import LLM
    from mini.bench.workload import machine_line

    probe = LLM(model=args.model, max_model_len=64, num_gpu_blocks_override=8)
    tokenizer, model_dir = probe.get_tokenizer(), str(probe.llm_engine.config.model_dir)
    del probe
    token_ids = tokenizer(HELDOUT_TEXT.read_text(), add_special_tokens=False)["input_ids"]
    windows = windows_of(token_ids, args.window)
    print(machine_line(torch.get_num_threads(), "cpu"))
    print(f"text: {HELDOUT_TEXT.name}, {len(token_ids)} tokens in {len(windows)} windows of up to {args.window}; "
          f"model {args.model or 'the shipped tiny model'}")
    results: dict[str, float] = {}
    for label in args.schemes:
        dtype, quantization = SCHEMES[label]
        start = time.perf_counter()
        total, count = mini_nll(args.model, dtype, quantization, windows)
        results[label] = math.exp(total / count)
        print(f"mini {label:<9} ({dtype}, quantization={quantization}): ppl {results[label]:.3f} over {count} "
              f"tokens ({time.perf_counter() - start:.0f} s)")
    if args.transformers:
        for dtype in ("float32", "bfloat16"):
            total, count = transformers_nll(model_dir, dtype, windows)
            print(f"transformers {dtype}: ppl {math.exp(total / count):.3f}")
    if "float32" in results:
        ratios = " ".join(f"{label}={value / results['float32']:.3f}" for label, value in results.items())
        print(f"ppl_ratio_vs_float32 {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
