"""Async scheduling, measured: the same greedy workload with `async_scheduling` off and on.

In the spirit of vLLM's `vllm bench throughput --async-scheduling`. Two engines built alike (the shipped model
unless `model` is given), warmed up once, then `rounds` rounds alternating sync, async, sync, async, ... so a
burst of load on a shared machine hits both alike. Each round runs `num_requests` token-id prompts of
`prompt_len` tokens for exactly `output_len` tokens (EOS ignored: both engines produce the same tokens, checked).
Per-step time = round time / `output_len` (every request decodes one token per step, all in one batch).

What to expect: with async scheduling the host work of a step (scheduling, the output handling, detokenizing)
runs while the worker thread computes the next forward. On a CPU both share the same cores, so the saving is
at most that host work (about 1-2 ms of a ~20 ms step on the shipped model at batch 16) and shrinks when the
cores are busy; on a GPU the forward runs on the device and the whole host time per step is hidden.

    python -m mini bench async_scheduling [--requests 16] [--output-len 64] [--rounds 3] [--multiprocess]
                                          [--device cuda --dtype bfloat16]
Last line: `sync_ms_per_step=X async_ms_per_step=Y saved_ms_per_step=Z async_speedup=S` (medians).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from mini import LLM, SamplingParams
from mini.bench.workload import side_by_side_kv_args


def run(num_requests: int = 16, output_len: int = 64, prompt_len: int = 32, rounds: int = 3,
        model: str | None = None, multiprocess: bool = False, **engine_args: Any) -> dict[str, Any]:
    """Time sync vs async scheduling (module docstring) -> medians, spreads and the per-round seconds."""
    previous = os.environ.get("MINI_ENABLE_V1_MULTIPROCESSING")
    os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    try:
        engines = {mode: LLM(model=model, async_scheduling=mode == "async", max_num_seqs=max(num_requests, 1),
                             **engine_args) for mode in ("sync", "async")}
    finally:
        if previous is None:
            os.environ.pop("MINI_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = previous
    rng = random.Random(0)
    vocab_size = engines["sync"].llm_engine.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(1, vocab_size) for _ in range(prompt_len)]}
               for _ in range(num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    seconds: dict[str, list[float]] = {"sync": [], "async": []}
    tokens: dict[str, list] = {}
    try:
        for mode, llm in engines.items():   # warm-up, untimed
            tokens[mode] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        if tokens["sync"] != tokens["async"]:
            raise AssertionError("async scheduling produced other tokens than sync scheduling")
        for _ in range(rounds):
            for mode, llm in engines.items():
                started = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                seconds[mode].append(time.perf_counter() - started)
    finally:
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
    per_step = {mode: [s / output_len * 1e3 for s in values] for mode, values in seconds.items()}
    sync_ms, async_ms = statistics.median(per_step["sync"]), statistics.median(per_step["async"])
    return {
        "sync_ms_per_step": sync_ms, "async_ms_per_step": async_ms, "saved_ms_per_step": sync_ms - async_ms,
        "async_speedup": statistics.median(s / a for s, a in zip(seconds["sync"], seconds["async"], strict=False)),
        "spread_ms_per_step": {mode: (min(v), max(v)) for mode, v in per_step.items()},
        "seconds": seconds, "num_requests": num_requests, "output_len": output_len, "rounds": rounds,
        "multiprocess": multiprocess,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench async_scheduling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--multiprocess", action="store_true", help="the engine core in a child process")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    engine_args: dict[str, Any] = {"device": args.device, **side_by_side_kv_args(args.device)}
    if args.dtype:
        engine_args["dtype"] = args.dtype
    result = run(args.requests, args.output_len, args.prompt_len, args.rounds, args.model, args.multiprocess,
                 **engine_args)
    for mode in ("sync", "async"):
        low, high = result["spread_ms_per_step"][mode]
        print(f"{mode:>5} scheduling: {result[f'{mode}_ms_per_step']:.2f} ms/step (spread {low:.2f}-{high:.2f})")
    print(f"sync_ms_per_step={result['sync_ms_per_step']:.2f} async_ms_per_step={result['async_ms_per_step']:.2f} "
          f"saved_ms_per_step={result['saved_ms_per_step']:.2f} async_speedup={result['async_speedup']:.3f}")
    return result


if __name__ == "__main__":
    main()
