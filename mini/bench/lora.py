"""Many LoRA adapters in one batch, measured: a batch mixing adapters, the same batch one adapter at a time, none.

What multi-LoRA serving buys (vLLM's punica kernels, vllm/lora/punica_wrapper/): requests for different
adapters share every step instead of waiting for their adapter's turn. On the shipped model, with random
rank-`--rank` adapters on every projection (written as PEFT folders into a temporary directory; no `peft`
needed), one engine (`enable_lora=True, max_loras=--num-adapters`) runs three ways:

* base:   the batch with no adapter (the LoRA layers are there, the step maps no token to a slot);
* mixed:  the same batch, request i with adapter i mod N, all in one `generate` (the adapters share every step);
* serial: the same requests grouped by adapter, one `generate` per adapter (an engine that holds one
  adapter at a time would run them so).

Warm-up first (untimed; every adapter loaded into its slot), then `--rounds` rounds of base, mixed, serial;
each is printed as the median wall time and (prompt + generated tokens) / wall time over the rounds, with the
spread (min-max). Last line:
`mixed_vs_base=X serial_vs_mixed=Y` (time ratios of the fastest rounds: mixed / base, serial / mixed).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from mini import LLM, LoRARequest, SamplingParams
from mini.bench.workload import machine_line, spread
from mini.lora.peft_helper import CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE, target_shapes
from mini.model.llama import DecoderConfig
from mini.model.loader import read_hf_config


def write_random_adapter(folder: Path, decoder_config: DecoderConfig, rank: int, seed: int) -> Path:
    """A PEFT-format LoRA folder with random A and B on every projection (what `peft` would save)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(decoder_config.num_hidden_layers):
        for proj, (in_features, out_features) in target_shapes(decoder_config).items():
            prefix = f"base_model.model.model.layers.{layer}.{TARGET_MODULES[proj]}.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.02
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                  "target_modules": sorted(TARGET_MODULES), "bias": "none"}))
    return folder


def timed(llm: LLM, prompts: list[dict], params: SamplingParams, loras: list) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m mini bench lora", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a local HF folder (default: the shipped tiny model)")
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for name in ("num_adapters", "num_requests", "prompt_len", "max_tokens", "rank", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    llm = LLM(model=args.model, enable_lora=True, max_loras=args.num_adapters, max_lora_rank=args.rank,
              max_num_seqs=args.num_requests, max_num_batched_tokens=max(512, args.num_requests * args.prompt_len))
    decoder_config = DecoderConfig.from_hf_config(read_hf_config(llm.llm_engine.config.model_dir))
    rng = random.Random(0)
    vocab = llm.llm_engine.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(args.prompt_len)]}
               for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    with tempfile.TemporaryDirectory(prefix="mini-bench-lora-") as root:
        adapters = [LoRARequest(f"adapter{i}", i + 1, str(write_random_adapter(Path(root) / f"a{i}", decoder_config,
                                                                                  args.rank, seed=i)))
                    for i in range(args.num_adapters)]
        mixed = [adapters[i % args.num_adapters] for i in range(args.num_requests)]
        groups = [[i for i in range(args.num_requests) if i % args.num_adapters == a] for a in range(args.num_adapters)]

        def serial() -> tuple[float, int]:
            runs = [timed(llm, [prompts[i] for i in group], params, [mixed[i] for i in group]) for group in groups]
            return sum(r[0] for r in runs), sum(r[1] for r in runs)

        ways = {"base": lambda: timed(llm, prompts, params, None),
                "mixed": lambda: timed(llm, prompts, params, mixed),
                "serial": serial}
        print(machine_line(torch.get_num_threads(), str(llm.llm_engine.config.device)), flush=True)
        print(f"{args.num_requests} requests x ({args.prompt_len} prompt + {args.max_tokens} output tokens), "
              f"{args.num_adapters} adapters of rank {args.rank} on every projection, {args.model or 'shipped model'}, "
              f"torch threads {torch.get_num_threads()}, warm-up + {args.rounds} rounds")
        for run in ways.values():   # warm-up: every adapter into its slot, allocator, first passes
            run()
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        tokens: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, run in ways.items():
                elapsed, tokens[name] = run()
                seconds[name].append(elapsed)
    for name in ways:
        print(f"{name} ms: {spread([s * 1e3 for s in seconds[name]])}")
        print(f"{name} tok/s: {spread([tokens[name] / s for s in seconds[name]])}")
    # Ratios of the fastest rounds: on a shared machine a round is only ever slowed by the others' load, so the
    # fastest is the closest to the work itself (the medians above show how noisy the machine was).
    summary = {"mixed_vs_base": min(seconds["mixed"]) / min(seconds["base"]),
               "serial_vs_mixed": min(seconds["serial"]) / min(seconds["mixed"])}
    print(" ".join(f"{name}={value:.2f}" for name, value in summary.items()))
    llm.llm_engine.shutdown()
    return summary


if __name__ == "__main__":
    main()
