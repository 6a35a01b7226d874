"""`python -m mini bench compile`: torch.compile (`compilation_config=3`, mini/compilation.py) against eager.

Mirrors what vLLM reports at start-up ("torch.compile takes N s in total") and what its compilation is for:
the forward traced once, attention an opaque op, inductor over the rest. The same engine and workload
(`bench engine`'s: prompt windows of the stdlib corpus, greedy, EOS ignored), once with the model's forward
compiled and once eager, alternating round by round, both engine cores in this process.

The compiled engine splits its graph at the attention ops and compiles the pieces (vLLM's default for mode 3,
mini/piecewise_compile.py); `--one-graph` compiles the whole forward as one inductor graph instead
(`splitting_ops=[]`). Compile seconds depend on inductor's cache (`TORCHINDUCTOR_CACHE_DIR`, by default
`/tmp/torchinductor_$USER`): give each run an empty folder of its own to compare the two cold.

Printed: the compile seconds (building the compiled engine and its first run, minus the same for the eager
one: on a GPU the CUDA-graph capture at start-up runs the forward, so it compiles there; on a CPU the first
step does), output tokens per second of each as median (min-max), and whether the greedy outputs are
token-identical. Last line: `compile_speedup=X.XX compile_seconds=Y.Y identical=True|False split=attention|none`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from mini.bench.workload import (
    Workload,
    generate_greedy,
    machine_line,
    make_workload,
    side_by_side_kv_args,
    spread,
)


def _timed(build):
    start = time.perf_counter()
    result = build()
    return result, time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench compile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder, .gguf file or offline hub id")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 64 (shipped model), 8 (other)")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--one-graph", action="store_true",
                        help="compile the whole forward as one graph (splitting_ops=[]) instead of split at attention")
    return parser


def main(argv: list[str] | None = None) -> int:
    # Both engine cores in this process, on this process's threads (two child cores would share them).
    os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from mini import LLM

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    num_prompts = args.num_prompts or (64 if args.model is None else 8)
    common = {"model": args.model, "device": args.device, "dtype": dtype, "max_num_seqs": 64,
              "max_num_batched_tokens": 1024, **side_by_side_kv_args(args.device)}
    print(machine_line(torch.get_num_threads(), args.device), flush=True)
    eager, eager_build = _timed(lambda: LLM(**common))
    print(f"eager engine built in {eager_build:.1f} s; building the compiled one (on a GPU its CUDA-graph capture "
          "runs the compiled forward, so most of the compiling happens here) ...", flush=True)
    compilation_config = {"mode": 3, "splitting_ops": [] if args.one_graph else None}
    compiled, compiled_build = _timed(lambda: LLM(compilation_config=compilation_config, **common))
    print(f"compiled engine built in {compiled_build:.1f} s", flush=True)
    workload = make_workload(eager.get_tokenizer(), num_prompts, tuple(args.prompt_len), tuple(args.output_len), 0)
    warm_up = Workload(workload.prompts[:4], [8] * len(workload.prompts[:4]))
    print(f"workload: {num_prompts} prompts, {workload.num_output_tokens} output tokens; {args.device} {dtype}")
    eager_first = generate_greedy(eager, warm_up)[0]
    compiled_first = generate_greedy(compiled, warm_up)[0]
    compile_seconds = (compiled_build + compiled_first) - (eager_build + eager_first)
    print(f"compile: {compile_seconds:.1f} s (building the compiled engine and its first run, minus the same for "
          "the eager one)", flush=True)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    identical = True
    for round_index in range(args.rounds):
        eager_time, eager_out = generate_greedy(eager, workload)
        compiled_time, compiled_out = generate_greedy(compiled, workload)
        times["eager"].append(eager_time)
        times["compiled"].append(compiled_time)
        identical = identical and eager_out == compiled_out
        print(f"round {round_index}: eager {eager_time:.2f}s, compiled {compiled_time:.2f}s")
    tokens = workload.num_output_tokens
    print(f"eager:    {spread([tokens / t for t in times['eager']])} output tok/s")
    print(f"compiled: {spread([tokens / t for t in times['compiled']])} output tok/s")
    speedup = statistics.median(times["eager"]) / statistics.median(times["compiled"])
    split = "none" if args.one_graph else "attention"
    print(f"compile_speedup={speedup:.2f} compile_seconds={compile_seconds:.1f} identical={identical} split={split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
