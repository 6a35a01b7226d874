"""`python -m mini bench`: mini's throughput vs transformers `generate()`, and vs the model alone.

Mirrors vllm/benchmarks/throughput.py (`vllm bench throughput`, whose `--backend hf` runs the same
workload through transformers with padded batches). One process, one workload, the two systems
alternating round by round so machine noise hits both alike:

- mini: every request added at once; the engine batches them continuously (paged KV, chunked prefill).
- transformers: what a user would otherwise write: left-padded batches of `--hf-batch-size`, greedy
  `generate()` with the batch's longest output length (shorter requests ride along as padding).
- ceiling: mini's model forward passes alone, replaying the exact batches the engine ran (same
  input_ids, positions and attention metadata) with no scheduler, sampler or bookkeeping.

Throughput counts the output tokens each request asked for. Every figure is the median of the rounds, printed
with its spread (min-max). The first line names the machine, the torch threads and the commit. The last line is
`speedup_vs_transformers=X.XX ceiling_fraction=Y.YY` (engine time spent in the model / engine time).
`--peer llamacpp` compares with llama.cpp instead of transformers (mini/bench/llamacpp.py; last line
`speedup_vs_llamacpp=X.XX ttft_ratio=Y.YY`). `--device cuda --dtype bfloat16` runs both on a GPU
(`--enforce-eager`: mini without CUDA graphs).
`-O 3` compiles mini's forward (`compilation_config=3`; its compile time falls in the warm-up, outside the rounds).
`--baseline-attention-backend torch` adds a third system to every round, mini with the readable phase 03
attention (mini/attention/reference.py) instead of the CPU default, to show what the fast path buys.

The workload's shape (prompt and output lengths drawn from the same ranges, seed 0) is the same for
every model; its size is not: the shipped 3M-parameter model runs 128 prompts, a real model
(`--model HuggingFaceTB/SmolLM2-135M-Instruct`, 45x larger) 8 prompts, 3 rounds each, so that one run takes
a few minutes on 2 CPU cores. `--num-prompts` / `--rounds` override either.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from mini.bench import llamacpp
from mini.bench.workload import (
    REAL_MODEL_SIZE,
    SHIPPED_MODEL_SIZE,
    Workload,
    _synchronize,
    machine_line,
    make_workload,
    run_mini,
    spread,
)
from mini.config import ATTENTION_BACKENDS
from mini.model.quantization import QUANTIZATION_METHODS


def replay_model_only(llm, recorded: list) -> float:
    """Time the model's forward + logits alone over the batches the engine ran."""
    runner = llm.llm_engine.model_runner
    start = time.perf_counter()
    with torch.inference_mode():
        for step_inputs in recorded:
            runner.replay_forward(step_inputs)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run_transformers(model, tokenizer, workload: Workload, batch_size: int, device: str = "cpu") -> float:
    """Greedy `generate()` in left-padded batches, each run to its longest requested output."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first:first + batch_size]
        max_new = max(workload.output_lens[first:first + batch_size])
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                           do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=pad_id)
    _synchronize(device)
    return time.perf_counter() - start




def apply_default_size(args: argparse.Namespace) -> None:
    """Fill --num-prompts / --rounds left unset from the model's size class."""
    size = SHIPPED_MODEL_SIZE if args.model is None else REAL_MODEL_SIZE
    for name, value in size.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="local HF folder, .gguf file or offline hub id (default: the shipped tiny model)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help=f"default {SHIPPED_MODEL_SIZE['num_prompts']} (shipped model), "
                             f"{REAL_MODEL_SIZE['num_prompts']} (any other model)")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds, the median is reported; default "
                             f"{SHIPPED_MODEL_SIZE['rounds']} (shipped model), {REAL_MODEL_SIZE['rounds']} (other)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--attention-backend", default=None, choices=ATTENTION_BACKENDS,
                        help="mini's attention backend (default: the engine's choice, torch_fast on CPU)")
    parser.add_argument("--baseline-attention-backend", default=None, choices=ATTENTION_BACKENDS,
                        help="also time mini with this attention backend in every round (e.g. torch)")
    parser.add_argument("--peer", default="transformers", choices=("transformers", "llamacpp"),
                        help="what mini is compared with: transformers generate() (default) or llama.cpp through "
                             "llama-cpp-python on the model's GGUF file (pip install -e '.[llamacpp]')")
    parser.add_argument("--llamacpp-weights", default="match", choices=("match", "f32", "bf16", "q8_0", "q4_0", "gguf"),
                        help="with --peer llamacpp: match (default) runs llama.cpp on a copy of the GGUF file whose "
                             "matrices are in the type matching mini's (f32 for float32, bf16 for bfloat16, q8_0 for "
                             "int8, q4_0 for gptq), made from the values mini computes with; gguf runs the file as "
                             "shipped (Q4_1 for SmolLM2)")
    parser.add_argument("--llamacpp-batching", default="batched", choices=("batched", "sequential"),
                        help="with --peer llamacpp: batched (default) decodes all requests in one llama.cpp batch, "
                             "as mini does; sequential runs them one after another (llama-cpp-python's generate)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="default float32 on cpu, bfloat16 on cuda (both systems)")
    parser.add_argument("--quantization", default=None, choices=QUANTIZATION_METHODS,
                        help="mini's weight quantization (mini/model/quantization/; default: none)")
    parser.add_argument("--enforce-eager", action="store_true", help="mini without CUDA graphs")
    parser.add_argument("-O", "--compilation-config", type=int, default=None, choices=(0, 3),
                        help="mini's compilation mode (mini/compilation.py; default: the engine's, 0 = eager)")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # It reads the model runner (attention backend, timers): the engine core stays in this process.
    os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"
    args = build_parser().parse_args(argv)
    apply_default_size(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda needs a CUDA GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.dtype = dtype
    if args.peer == "llamacpp":
        return llamacpp.compare(args)
    from transformers import AutoModelForCausalLM

    from mini import LLM

    engine_args = {"model": args.model, "max_num_seqs": args.max_num_seqs, "device": args.device, "dtype": dtype,
                   "max_num_batched_tokens": args.max_num_batched_tokens, "seed": args.seed,
                   "enforce_eager": args.enforce_eager, "compilation_config": args.compilation_config,
                   "quantization": args.quantization}
    llm = LLM(attention_backend=args.attention_backend, **engine_args)
    baseline = None
    if args.baseline_attention_backend is not None:
        baseline = LLM(attention_backend=args.baseline_attention_backend, **engine_args)
    tokenizer = llm.get_tokenizer()
    model_dir = str(llm.llm_engine.config.model_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(args.device).eval()
    workload = make_workload(tokenizer, args.num_prompts, tuple(args.prompt_len), tuple(args.output_len),
                             args.seed)
    print(machine_line(torch.get_num_threads(), args.device))
    print(f"workload: {args.num_prompts} prompts, {workload.num_prompt_tokens} prompt tokens, "
          f"{workload.num_output_tokens} output tokens (greedy, ignore_eos); {args.device} {dtype}, "
          f"mini's quantization={args.quantization}; "
          f"{args.rounds} alternating rounds")

    run_mini(llm, Workload(workload.prompts[:4], [4] * 4))  # warm-up, every system
    run_transformers(hf_model, tokenizer, Workload(workload.prompts[:2], [4, 4]), 2, args.device)
    if baseline is not None:
        run_mini(baseline, Workload(workload.prompts[:4], [4] * 4))

    # Wall seconds per round, and CPU seconds of this process: on a machine shared with other jobs the CPU
    # time shows how much work each system did, whatever the scheduler did to its wall time.
    wall: dict[str, list[float]] = {"mini": [], "model": [], "hf": [], "baseline": []}
    cpu: dict[str, list[float]] = {"mini": [], "hf": [], "baseline": []}
    for round_index in range(args.rounds):
        cpu_start = time.process_time()
        mini_time, recorded = run_mini(llm, workload, record_steps=True)
        cpu["mini"].append(time.process_time() - cpu_start)
        wall["mini"].append(mini_time)
        wall["model"].append(replay_model_only(llm, recorded))
        cpu_start = time.process_time()
        wall["hf"].append(run_transformers(hf_model, tokenizer, workload, args.hf_batch_size, args.device))
        cpu["hf"].append(time.process_time() - cpu_start)
        baseline_note = ""
        if baseline is not None:
            cpu_start = time.process_time()
            wall["baseline"].append(run_mini(baseline, workload)[0])
            cpu["baseline"].append(time.process_time() - cpu_start)
            baseline_note = (f", mini with {args.baseline_attention_backend} attention {wall['baseline'][-1]:.2f}s "
                             f"(cpu {cpu['baseline'][-1]:.1f}s)")
        print(f"round {round_index}: mini {mini_time:.2f}s (cpu {cpu['mini'][-1]:.1f}s, {len(recorded)} steps), "
              f"model alone {wall['model'][-1]:.2f}s, transformers {wall['hf'][-1]:.2f}s "
              f"(cpu {cpu['hf'][-1]:.1f}s){baseline_note}")

    tokens = workload.num_output_tokens
    rates = {name: [tokens / t for t in times] for name, times in wall.items()}
    mini_time, hf_time, ceiling_time = (statistics.median(wall[name]) for name in ("mini", "hf", "model"))
    print(f"mini:          {spread(rates['mini'])} output tok/s, median (min-max)")
    print(f"transformers:  {spread(rates['hf'])} output tok/s  (batch {args.hf_batch_size}, padded)")
    print(f"model alone:   {spread(rates['model'])} output tok/s  (ceiling: the same batches, no engine)")
    if wall["baseline"]:
        baseline_time = statistics.median(wall["baseline"])
        print(f"mini, {args.baseline_attention_backend} attention: {spread(rates['baseline'])} output tok/s  "
              f"(attention backend {llm.llm_engine.model_runner.attention_backend} is "
              f"{baseline_time / mini_time:.2f}x faster; vs transformers {hf_time / baseline_time:.2f}x)")
    print(f"by CPU time: transformers / mini = {statistics.median(cpu['hf']) / statistics.median(cpu['mini']):.2f}")
    ratios = [hf / mini for hf, mini in zip(wall["hf"], wall["mini"], strict=False)]
    print(f"speedup per round: {spread(ratios)}")
    print(f"speedup_vs_transformers={hf_time / mini_time:.2f} ceiling_fraction={ceiling_time / mini_time:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
