"""Prefix caching, measured: a shared system prompt prefilled once, with `enable_prefix_caching` on and off.

In the spirit of vLLM's benchmarks/benchmark_prefix_caching.py: every request is a long shared system
prompt (512 tokens by default) followed by a short private question, so about 90 % of each prompt is
shared. Two measurements per engine, caching off then on, in one process on the shipped model:

* time to first token: the requests arrive one at a time (each is finished before the next arrives,
  as in a chat service); TTFT is the time from `add_request` to the request's first output token.
  With caching on, only the first request prefills the system prompt; the others compute only the
  tokens after the last full cached block;
* throughput: all requests at once through `LLM.generate`; (prompt + generated tokens) / wall time.

One engine per setting, both warmed up first (untimed); then `--rounds` rounds (3 by default) alternate
off, on, off, on, ..., each starting from an empty cache, so a burst of load on a shared machine hits both
settings alike. Each figure is the median over the rounds, printed with its spread (min-max); a speedup is
the median of the paired rounds' ratios. A wide spread means the machine was busy: run it again.
The hit rate is the prefix cache's own counter (`LLMEngine.get_scheduler_stats().prefix_cache_stats`: tokens
found cached / tokens looked up) in the last round's throughput run.
Last line: `ttft_speedup=X.XX throughput_speedup=Y.YY hit_rate=Z.ZZ` (medians; off / on for the times).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from mini import LLM, SamplingParams


def make_prompts(num_requests: int, shared_len: int, private_len: int, vocab_size: int, seed: int = 0
                 ) -> list[dict]:
    """Token-id prompts: one shared system prompt + a private tail each (deterministic for a seed)."""
    rng = random.Random(seed)
    system = [rng.randrange(1, vocab_size) for _ in range(shared_len)]
    return [{"prompt_token_ids": system + [rng.randrange(1, vocab_size) for _ in range(private_len)]}
            for _ in range(num_requests)]


def time_to_first_token(llm: LLM, prompts: list[dict], params: SamplingParams) -> list[float]:
    """Each request alone: seconds from add_request to its first output token."""
    engine = llm.llm_engine
    ttfts = []
    for index, prompt in enumerate(prompts):
        request_id = f"ttft-{index}"
        start = time.perf_counter()
        engine.add_request(request_id, prompt, params)
        first = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                if first is None and output.request_id == request_id and output.outputs[0].token_ids:
                    first = time.perf_counter() - start
        ttfts.append(first if first is not None else float("nan"))
    return ttfts


def build(enable_prefix_caching: bool, num_requests: int, max_num_batched_tokens: int) -> LLM:
    return LLM(enable_prefix_caching=enable_prefix_caching, max_num_batched_tokens=max_num_batched_tokens,
               max_num_seqs=num_requests)


def measure(llm: LLM, prompts: list[dict], params: SamplingParams) -> dict[str, float]:
    """One round on one engine: the TTFT of each request alone (median), then all at once (throughput).
    The cache is emptied before each part, so every round starts cold and hits only within itself."""
    llm.reset_prefix_cache()
    ttfts = time_to_first_token(llm, prompts, params)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs)
    stats = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    return {"ttft": statistics.median(ttfts), "throughput": num_tokens / elapsed, "hit_rate": stats.hit_rate,
            "cached_tokens": sum(o.num_cached_tokens for o in outputs)}


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Parse `argv`; warm both engines up, then run alternating rounds (caching off, on, off, on, ...) and
    print the median of each figure over the rounds with its spread (min-max); return the medians."""
    parser = argparse.ArgumentParser(prog="python -m mini bench prefix", description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--shared-len", type=int, default=512, help="tokens of the shared system prompt")
    parser.add_argument("--private-len", type=int, default=57, help="private tokens per request (90 %% shared)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds after the warm-up (>= 1)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engines = {caching: build(caching, args.num_requests, args.max_num_batched_tokens) for caching in (False, True)}
    vocab_size = engines[False].llm_engine.vocab_size
    prompts = make_prompts(args.num_requests, args.shared_len, args.private_len, vocab_size)
    shared = args.shared_len / (args.shared_len + args.private_len)
    print(f"{args.num_requests} requests, {args.shared_len} shared + {args.private_len} private tokens "
          f"({shared:.0%} shared), {args.max_tokens} output tokens, torch threads {torch.get_num_threads()}, "
          f"warm-up + {args.rounds} alternating rounds (off, on, off, on, ...)")
    for llm in engines.values():   # warm-up: allocator, kernels, the first forward passes (not timed)
        measure(llm, prompts[:2], params)
    rounds: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for caching in (False, True):
            rounds[caching].append(measure(engines[caching], prompts, params))
    for caching in (False, True):
        ttfts = [r["ttft"] * 1e3 for r in rounds[caching]]
        throughputs = [r["throughput"] for r in rounds[caching]]
        last = rounds[caching][-1]
        print(f"prefix caching {'on ' if caching else 'off'}: median TTFT {statistics.median(ttfts):8.1f} ms "
              f"(rounds {_spread(ttfts)}), throughput {statistics.median(throughputs):8.0f} tok/s "
              f"(rounds {_spread(throughputs)}), hit rate {last['hit_rate']:.2f}, "
              f"cached prompt tokens {last['cached_tokens']}")
    ttft_ratios = [off["ttft"] / on["ttft"] for off, on in zip(rounds[False], rounds[True], strict=False)]
    throughput_ratios = [on["throughput"] / off["throughput"]
                         for off, on in zip(rounds[False], rounds[True], strict=False)]
    print(f"per-round speedups (off/on, paired rounds): TTFT {_spread(ttft_ratios)}, "
          f"throughput {_spread(throughput_ratios)}")
    summary = {
        "ttft_speedup": statistics.median(ttft_ratios),
        "throughput_speedup": statistics.median(throughput_ratios),
        "hit_rate": rounds[True][-1]["hit_rate"],
    }
    print(" ".join(f"{name}={value:.2f}" for name, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
