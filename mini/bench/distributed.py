"""`python -m mini bench distributed`: what the process split, async scheduling, TP and DP cost or buy.

In the spirit of vLLM's benchmarks/ (`vllm bench throughput` / `vllm bench serve` run with
`VLLM_ENABLE_V1_MULTIPROCESSING=0|1`, `--async-scheduling`, `-tp N`, `-dp N`). Four comparisons, each the
same greedy workload (token-id prompts, EOS ignored, so every system produces the same tokens) with the two
systems alternating round by round; every figure is the median of the rounds with its spread (min-max):

1. **process split**: the engine core in this process (`MINI_ENABLE_V1_MULTIPROCESSING=0`, `InprocClient`) vs
   in a child process (`SyncMPClient`: msgspec over ZMQ each step). `mp_overhead_ms_per_step` = (mp time -
   in-process time) / engine steps.
2. **async scheduling**: `async_scheduling=True` vs False (both multiprocess, as vLLM runs it):
   `async_speedup` = sync time / async time.
3. **tensor parallelism**: `tensor_parallel_size=2` vs 1 on the shipped model (`tp2_over_tp1` = TP=2 throughput
   / TP=1 throughput) and 3 vs 1 on SmolLM2-135M-Instruct when it is installed (`tp3_over_tp1_smollm2`). Every
   model process runs `--threads` torch threads (default 1): TP=1 uses one core, TP=N one per rank.
4. **data parallelism**: the OpenAI server with `data_parallel_size=2` vs 1 under concurrent streaming clients
   (mini/bench/dp.py): `dp2_over_dp1` = throughput ratio.

Last line: `mp_overhead_ms_per_step=X async_speedup=Y tp2_over_tp1=Z` (then the optional figures).
`--only split,async,tp,dp` runs a subset.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from mini.bench.workload import machine_line, make_workload, spread
from mini.sampling_params import SamplingParams

ENV_MULTIPROCESSING = "MINI_ENABLE_V1_MULTIPROCESSING"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SECTIONS = ("split", "async", "tp", "dp")


@contextlib.contextmanager
def multiprocessing_mode(enabled: bool) -> Iterator[None]:
    """Build engines in this block with the core in-process (False) or in a child process (True)."""
    old = os.environ.get(ENV_MULTIPROCESSING)
    os.environ[ENV_MULTIPROCESSING] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_MULTIPROCESSING, None)
        else:
            os.environ[ENV_MULTIPROCESSING] = old


def build_llm(model: str | None, multiprocess: bool, **engine_args: Any):
    from mini import LLM

    with multiprocessing_mode(multiprocess):
        return LLM(model=model, **engine_args)


def time_generate(llm, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]]]:
    """Seconds for `LLM.generate` over the prompts, and the token ids (to check every system agrees)."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]


def count_steps(model: str | None, prompts: list[list[int]], output_len: int, **engine_args: Any) -> int:
    """Engine steps the workload takes (an in-process engine counts them; the schedule is deterministic)."""
    llm = build_llm(model, multiprocess=False, **engine_args)
    try:
        scheduler = llm.llm_engine.scheduler
        before = scheduler.step_index
        time_generate(llm, prompts, output_len)
        return scheduler.step_index - before
    finally:
        shutdown(llm)


def shutdown(llm) -> None:
    closer = getattr(llm, "shutdown", None) or getattr(llm.llm_engine, "shutdown", None)
    if closer is not None:
        closer()


def compare(systems: dict[str, Any], prompts: list[list[int]], output_len: int, rounds: int
            ) -> dict[str, list[float]]:
    """Alternate the systems round by round -> seconds per round per system; their tokens must agree."""
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    reference = None
    for _ in range(rounds):
        for name, llm in systems.items():
            elapsed, tokens = time_generate(llm, prompts, output_len)
            seconds[name].append(elapsed)
            if reference is None:
                reference = (name, tokens)
            elif tokens != reference[1]:
                raise AssertionError(f"{name} produced other tokens than {reference[0]} on the same greedy workload")
    return seconds


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def run_pair(label: str, make: dict[str, Any], prompts: list[list[int]], output_len: int, rounds: int
             ) -> dict[str, list[float]]:
    """Build both systems, warm each once, time them alternately, shut them down; print the medians."""
    systems: dict[str, Any] = {}
    try:
        for name, factory in make.items():
            started = time.perf_counter()
            systems[name] = factory()
            print(f"  {label}: {name} started in {time.perf_counter() - started:.1f} s", flush=True)
        for llm in systems.values():
            time_generate(llm, prompts[:2], 2)   # warm-up
        seconds = compare(systems, prompts, output_len, rounds)
    finally:
        for llm in systems.values():
            shutdown(llm)
    tokens = len(prompts) * output_len
    for name, values in seconds.items():
        print(f"  {label}: {name:<24} {spread([tokens / s for s in values])} tok/s   "
              f"{spread(values)} s per round", flush=True)
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench distributed", description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smollm2-prompts", type=int, default=4,
                        help="prompts of the TP=3 SmolLM2 comparison (0: skip it)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every model process: the in-process engine, the engine-core child "
                             "(MINI_ENGINE_CORE_THREADS) and each TP worker; default 1, so that the process split is "
                             "compared at equal threads and TP=N uses N cores against TP=1's one")
    return parser


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = build_parser().parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {unknown}; allowed: {', '.join(SECTIONS)}")
    from mini.model.registry import resolve_model_dir
    from mini.tokenizer import load_tokenizer

    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    os.environ["MINI_ENGINE_CORE_THREADS"] = str(args.threads)
    threads = torch.get_num_threads()
    print(machine_line(threads, "cpu"), flush=True)
    tokenizer = load_tokenizer(resolve_model_dir(None))
    workload = make_workload(tokenizer, args.num_prompts, tuple(args.prompt_len), (1, 1), args.seed)
    prompts, out_len, rounds = workload.prompts, args.output_len, args.rounds
    print(f"workload: {len(prompts)} prompts of {args.prompt_len[0]}-{args.prompt_len[1]} tokens, {out_len} output "
          f"tokens each, greedy; {rounds} alternating rounds; median (min-max)", flush=True)
    results: dict[str, float] = {}

    if "split" in sections:
        print("1. the process split (shipped model)", flush=True)
        steps = count_steps(None, prompts, out_len)
        seconds = run_pair("split", {
            "in-process": lambda: build_llm(None, multiprocess=False),
            "multiprocess": lambda: build_llm(None, multiprocess=True),
        }, prompts, out_len, rounds)
        per_step = (_median(seconds["multiprocess"]) - _median(seconds["in-process"])) / max(steps, 1)
        results["mp_overhead_ms_per_step"] = per_step * 1e3
        print(f"  {steps} engine steps per round; multiprocess costs {per_step * 1e3:.3f} ms per step", flush=True)

    if "async" in sections:
        print("2. async scheduling (shipped model, multiprocess)", flush=True)
        seconds = run_pair("async", {
            "sync scheduling": lambda: build_llm(None, multiprocess=True, async_scheduling=False),
            "async scheduling": lambda: build_llm(None, multiprocess=True, async_scheduling=True),
        }, prompts, out_len, rounds)
        results["async_speedup"] = _median(seconds["sync scheduling"]) / _median(seconds["async scheduling"])

    if "tp" in sections:
        print("3. tensor parallelism (shipped model: 6 query / 2 KV heads)", flush=True)
        seconds = run_pair("tp", {
            "TP=1": lambda: build_llm(None, multiprocess=True),
            "TP=2": lambda: build_llm(None, multiprocess=True, tensor_parallel_size=2),
        }, prompts, out_len, rounds)
        results["tp2_over_tp1"] = _median(seconds["TP=1"]) / _median(seconds["TP=2"])
        from mini.model.registry import SMOLLM2_135M_INSTRUCT, installed_packaged_models

        if args.smollm2_prompts == 0:
            print("   SmolLM2 TP=3 skipped (--smollm2-prompts 0)", flush=True)
        elif SMOLLM2_135M_INSTRUCT in installed_packaged_models():
            print("   SmolLM2-135M-Instruct (9 query / 3 KV heads)", flush=True)
            small = prompts[:args.smollm2_prompts]
            seconds = run_pair("tp-smollm2", {
                "TP=1": lambda: build_llm(SMOLLM2, multiprocess=True, max_model_len=512),
                "TP=3": lambda: build_llm(SMOLLM2, multiprocess=True, max_model_len=512, tensor_parallel_size=3),
            }, small, out_len, rounds)
            results["tp3_over_tp1_smollm2"] = _median(seconds["TP=1"]) / _median(seconds["TP=3"])
        else:
            print("   SmolLM2-135M-Instruct is not installed (scripts/setup.sh installs it): TP=3 skipped", flush=True)

    if "dp" in sections:
        print("4. data parallelism (the OpenAI server, concurrent streaming clients)", flush=True)
        dp = importlib.import_module("mini.bench.dp")
        figures = dp.run(num_prompts=len(prompts), output_len=out_len, rounds=rounds, seed=args.seed)
        results["dp2_over_dp1"] = float(figures["dp2_over_dp1"])

    head = ["mp_overhead_ms_per_step", "async_speedup", "tp2_over_tp1"]
    line = [f"{name}={results.get(name, math.nan):.3f}" for name in head]
    line += [f"{name}={value:.3f}" for name, value in results.items() if name not in head]
    print(" ".join(line), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
