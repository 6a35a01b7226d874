"""Data parallelism under load: the OpenAI server with `data_parallel_size=2` vs 1, same streaming workload.

In the spirit of vLLM's `vllm bench serve` against `vllm serve -dp 2` and `-dp 1`. Both servers run in this
process on 127.0.0.1 (uvicorn on a thread each, as mini/bench/serve.py), each with its engine cores in child
processes; rounds alternate between them (DP=1, DP=2, DP=1, ...) so drift on a shared machine hits both. In
each round `concurrency` streaming clients send the same random token-id prompts (`ignore_eos`, greedy: every
request generates `output_len` tokens) until all are served; throughput = generated tokens / wall time, the
median of the rounds. `run()` is what `python -m mini bench distributed` calls (section 4);
`python -m mini.bench.dp` runs it alone. Last line: `dp1_tokens_per_s=X dp2_tokens_per_s=Y dp2_over_dp1=Z`.

What to expect: DP copies the whole model into each core, so on a GPU box with one GPU per core the ratio
approaches N for a workload that keeps every core busy. On a 2-core CPU the two cores share the same two CPU
cores that one core's matrix multiplies already use, and the front end (HTTP, detokenizing) is on them too:
expect a ratio near 1 or below, not 2.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

MODEL_NAME = "bench"


def run(num_prompts: int = 16, output_len: int = 16, rounds: int = 1, seed: int = 0, concurrency: int | None = None,
        model: str | None = None, prompt_len: tuple[int, int] = (16, 48), max_num_seqs: int = 16,
        timeout_s: float = 300.0, **_: Any) -> dict[str, float]:
    """DP=2 vs DP=1 server throughput; returns {"dp1_tokens_per_s", "dp2_tokens_per_s", "dp2_over_dp1"}.

    `concurrency`: clients at once (default: every prompt at once, so both cores have work)."""
    if num_prompts < 1 or output_len < 1 or rounds < 1:
        raise ValueError(f"num_prompts, output_len and rounds must be >= 1, got {num_prompts}, {output_len}, "
                         f"{rounds}")
    from contextlib import ExitStack

    from mini.bench.serve import make_prompts, run_level
    from mini.engine.async_llm import AsyncLLM
    from mini.entrypoints.openai.api_server import build_app, serve_in_thread

    clients = concurrency or num_prompts
    urls: dict[int, str] = {}
    seconds: dict[int, list[float]] = {1: [], 2: []}
    tokens: dict[int, list[int]] = {1: [], 2: []}
    with ExitStack() as stack:
        vocab_size = 0
        for size in (1, 2):
            started = time.perf_counter()
            engine = AsyncLLM.from_engine_args(model=model, data_parallel_size=size, max_num_seqs=max_num_seqs)
            stack.callback(engine.shutdown)
            vocab_size = engine.engine.vocab_size
            urls[size] = stack.enter_context(serve_in_thread(build_app(engine, MODEL_NAME)))
            print(f"  DP={size}: server up in {time.perf_counter() - started:.1f} s", flush=True)
        prompts = make_prompts(num_prompts, prompt_len[0], prompt_len[1], vocab_size, seed)
        for size in (1, 2):   # warm-up: the first requests pay one-off costs
            asyncio.run(run_level(urls[size], 2, prompts[:2], 2, timeout_s))
        for index in range(rounds):
            for size in ((1, 2) if index % 2 == 0 else (2, 1)):
                result = asyncio.run(run_level(urls[size], clients, list(prompts), output_len, timeout_s))
                seconds[size].append(result.wall_s)
                tokens[size].append(result.output_tokens)
                print(f"  round {index + 1} DP={size}: {result.output_tokens} tokens in {result.wall_s:.2f} s "
                      f"= {result.tokens_per_s:.1f} tok/s", flush=True)
    per_s = {size: statistics.median(t / s for t, s in zip(tokens[size], seconds[size], strict=True))
             for size in (1, 2)}
    figures = {"dp1_tokens_per_s": per_s[1], "dp2_tokens_per_s": per_s[2], "dp2_over_dp1": per_s[2] / per_s[1]}
    print(f"  DP=2 / DP=1 throughput: {figures['dp2_over_dp1']:.3f} ({clients} streaming clients, "
          f"{num_prompts} prompts x {output_len} tokens)", flush=True)
    return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m mini.bench.dp", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    figures = run(num_prompts=args.num_prompts, output_len=args.output_len, rounds=args.rounds, seed=args.seed,
                  concurrency=args.concurrency, model=args.model)
    print(" ".join(f"{name}={value:.3f}" for name, value in figures.items()), flush=True)
    return figures


if __name__ == "__main__":
    main()
