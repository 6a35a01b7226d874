"""Mirrors vllm/v1/sample/sampler.py's hot path, measured: the vectorized sampler against a per-row loop.

A micro-benchmark in the spirit of vLLM's benchmarks/kernels/ scripts: one batch of 256 rows x
32,000 vocabulary entries, every row with its own temperature, top-k, top-p and penalties (a quarter
of the rows with no truncation at all, one in 16 seeded). Three timings on the same logits:

* `vectorized`: `SamplingMetadata.build(...)` then `Sampler()(logits, metadata)`, as one engine step;
* `loop`: the same operations applied row by row with single-row torch ops (penalties, temperature,
  sort-based top-k/top-p, softmax, exponential-race draw), as a per-request sampler would do;
* `sort`: one `torch.sort` of the whole [256, 32000] tensor, the cost of the textbook batched top-p.

The logits are LLM-like (a Gaussian tail plus a few dozen strongly preferred tokens per row); say
`--flat` for plain N(0, 1) logits, where top-p nuclei span most of the vocabulary.
Last line: `speedup_vs_loop=X.XX cost_vs_sort=Y.YY` (loop time / vectorized time, vectorized / sort).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from mini.sample.metadata import SamplingMetadata
from mini.sample.ops.topk_topp_sampler import exponentials_
from mini.sample.sampler import Sampler
from mini.sampling_params import SamplingParams


def make_batch(num_rows: int, vocab_size: int, flat: bool, seed: int = 0):
    """Logits, per-row SamplingParams, prompt and output histories (deterministic for a seed)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen)
    if not flat:
        logits *= 2.0
        favourites = torch.randint(0, vocab_size, (num_rows, 32), generator=gen)
        logits.scatter_add_(1, favourites, 6.0 + 6.0 * torch.rand(num_rows, 32, generator=gen))
    params, prompts, outputs = [], [], []
    for row in range(num_rows):
        kind = row % 8
        params.append(SamplingParams(
            temperature=rng.choice([0.5, 0.7, 0.8, 1.0, 1.2]),
            top_k=[0, 20, 50, 100, 0, 40, 0, 0][kind],
            top_p=[1.0, 1.0, 0.9, 0.95, 0.8, 0.9, 0.95, 1.0][kind],
            repetition_penalty=rng.choice([1.0, 1.1, 1.2]),
            frequency_penalty=rng.choice([0.0, 0.2, 0.5]),
            presence_penalty=rng.choice([0.0, 0.1, 0.3]),
            seed=row if row % 16 == 0 else None,
        ))
        prompts.append([rng.randrange(vocab_size) for _ in range(rng.randint(16, 256))])
        outputs.append([rng.randrange(vocab_size) for _ in range(rng.randint(0, 128))])
    return logits, params, prompts, outputs


def loop_sample(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                outputs: list[list[int]], generators: dict[int, torch.Generator]) -> torch.Tensor:
    """The per-row baseline: the sampler's operations applied to one row at a time (edits `logits`)."""
    vocab_size = logits.shape[1]
    sampled = torch.empty(logits.shape[0], dtype=torch.int64)
    for row, p in enumerate(params):
        x = logits[row]
        output_counts = torch.bincount(torch.tensor(outputs[row], dtype=torch.int64), minlength=vocab_size)
        seen = output_counts > 0
        seen[torch.tensor(prompts[row], dtype=torch.int64)] = True
        if p.repetition_penalty != 1.0:
            penalized = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
            x = torch.where(seen, penalized, x)
        x -= p.frequency_penalty * output_counts + p.presence_penalty * (output_counts > 0)
        x /= p.temperature
        sorted_x, order = x.sort(descending=True)
        if 0 < p.top_k < vocab_size:
            sorted_x[p.top_k:] = -float("inf")
        if p.top_p < 1.0:
            mass_before = sorted_x.softmax(-1).cumsum(-1) - sorted_x.softmax(-1)
            sorted_x[mass_before >= p.top_p] = -float("inf")
        probs = torch.zeros(vocab_size).scatter_(0, order, sorted_x.softmax(-1))
        race = exponentials_(torch.empty(vocab_size), generators.get(row))
        sampled[row] = (probs / race).argmax()
    return sampled


def time_it(fn: Callable[[torch.Tensor], object], logits: torch.Tensor, repeats: int) -> float:
    """Median wall time of `fn(fresh copy of logits)`; the copy is made outside the timed region
    (the engine hands the sampler fresh logits every step, and the sampler may edit them in place)."""
    fn(logits.clone())  # warm-up
    times = []
    for _ in range(repeats):
        fresh = logits.clone()
        start = time.perf_counter()
        fn(fresh)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(argv: list[str] | None = None) -> dict[str, float]:
    """Parse `argv`, time the three contenders, print the figures; return them."""
    parser = argparse.ArgumentParser(prog="python -m mini bench sampler", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flat", action="store_true", help="plain N(0,1) logits instead of LLM-like ones")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.vocab < 2 or args.repeats < 1:
        raise ValueError("--rows must be >= 1, --vocab >= 2 and --repeats >= 1")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    logits, params, prompts, outputs = make_batch(args.rows, args.vocab, args.flat)
    generators = {row: torch.Generator().manual_seed(p.seed) for row, p in enumerate(params)
                  if p.seed is not None}
    sampler = Sampler()

    def build_metadata(_logits: torch.Tensor) -> SamplingMetadata:
        return SamplingMetadata.build(params, prompts, outputs, generators, args.vocab, "cpu", None)

    def vectorized(fresh: torch.Tensor) -> torch.Tensor:
        return sampler(fresh, build_metadata(fresh)).sampled_token_ids

    t_build = time_it(build_metadata, logits, args.repeats)
    t_vec = time_it(vectorized, logits, args.repeats)
    t_loop = time_it(lambda fresh: loop_sample(fresh, params, prompts, outputs, generators), logits,
                     max(1, args.repeats // 2))
    t_sort = time_it(lambda fresh: fresh.sort(dim=-1), logits, args.repeats)

    print(f"batch {args.rows} x {args.vocab}, torch threads {torch.get_num_threads()}, "
          f"{'flat' if args.flat else 'LLM-like'} logits")
    print(f"vectorized sampler (incl. metadata build {t_build * 1e3:.1f} ms): {t_vec * 1e3:9.1f} ms")
    print(f"per-row python loop:                            {t_loop * 1e3:9.1f} ms")
    print(f"one torch.sort of the logits:                   {t_sort * 1e3:9.1f} ms")
    speedup, cost = t_loop / t_vec, t_vec / t_sort
    print(f"speedup_vs_loop={speedup:.2f} cost_vs_sort={cost:.2f}")
    return {"vectorized_s": t_vec, "loop_s": t_loop, "sort_s": t_sort, "speedup_vs_loop": speedup,
            "cost_vs_sort": cost}


def main(argv: list[str] | None = None) -> int:
    """`python -m mini bench sampler [options]`: exit status 0."""
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
