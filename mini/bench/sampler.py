"""Mirrors vllm/v1/sample/sampler.py's hot path, measured: mini's sampler against a per-row loop and vLLM's algorithm.

A micro-benchmark in the spirit of vLLM's benchmarks/kernels/ scripts: one batch of 256 rows x
32,000 vocabulary entries, every row with its own temperature, top-k, top-p and penalties (a quarter
of the rows with no truncation at all, one in 16 seeded). Four timings on the same logits, alternating
inside every round (medians of `--repeats` rounds):

* `vectorized`: `SamplingMetadata.build(...)` then `Sampler()(logits, metadata)`, as one engine step;
* `vllm_algo`: the same metadata build and penalties, then vLLM's own sampling algorithm as its
  PyTorch path runs it (vllm/v1/sample/ops/topk_topp_sampler.py: `apply_top_k_top_p_pytorch`, one
  ascending sort of every row with both cuts as masks on the sorted values, scattered back; softmax;
  `random_sample`, the exponential race with `Tensor.exponential_`), re-written here as the peer;
* `loop`: the same operations applied row by row with single-row torch ops (penalties, temperature,
  sort-based top-k/top-p, softmax, exponential-race draw), as a per-request sampler would do;
* `sort`: one `torch.sort` of the whole [256, 32000] tensor, the cost of the textbook batched top-p.

The logits are LLM-like (a Gaussian tail plus a few dozen strongly preferred tokens per row); say
`--flat` for plain N(0, 1) logits, where top-p nuclei span most of the vocabulary. Last line:
`speedup_vs_loop=X.XX cost_vs_sort=Y.YY speedup_vs_vllm_algo=Z.ZZ` (loop / vectorized, vectorized / sort,
vllm_algo / vectorized).
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


def vllm_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's sort-based cut (its `apply_top_k_top_p_pytorch`), written out: k = vocab_size / p = 1 are "off".

    Sort each row ascending; top-k masks what lies below the k-th largest value; top-p masks the prefix
    whose cumulative probability stays <= 1 - p (the largest token always stays); scatter back.
    """
    if k is None and p is None:
        return logits
    ascending, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_largest = ascending.gather(1, (ascending.shape[1] - k.long()).clamp(min=0).unsqueeze(1))
        ascending.masked_fill_(ascending < kth_largest, -float("inf"))
    if p is not None:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        below = cumulative <= 1 - p.unsqueeze(1)
        below[:, -1] = False
        ascending.masked_fill_(below, -float("inf"))
    return logits.scatter_(dim=-1, index=order, src=ascending)


def vllm_random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """The exponential race as vLLM draws it: `exponential_()` for the batch, then per seeded row."""
    race = torch.empty_like(probs).exponential_()
    for row, generator in generators.items():
        race[row].exponential_(generator=generator)
    return probs.div_(race).argmax(dim=-1)


def vllm_algorithm_probs(logits: torch.Tensor, metadata: SamplingMetadata, sampler: Sampler) -> torch.Tensor:
    """The distribution the peer draws from: mini's penalties, temperature, vLLM's sort-based cut, softmax.

    Every row of the benchmark samples (temperature > 0), so there is no greedy branch.
    """
    logits = sampler.apply_logits_processors(logits, metadata)
    assert metadata.temperature is not None and metadata.all_random
    logits = logits.div_(metadata.temperature.unsqueeze(1))
    for processor in metadata.logitsprocs.argmax_invariant:
        logits = processor.apply(logits)
    return vllm_top_k_top_p(logits, metadata.top_k, metadata.top_p).softmax(dim=-1, dtype=torch.float32)


def time_alternating(contenders: dict[str, Callable[[torch.Tensor], object]], logits: torch.Tensor,
                     rounds: int) -> dict[str, float]:
    """Median wall time of each `fn(fresh copy of logits)`, the contenders taking turns in every round.

    The copy is made outside the timed region (the engine hands the sampler fresh logits every step,
    and the sampler may edit them in place).
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn(logits.clone())  # warm-up
    for _ in range(rounds):
        for name, fn in contenders.items():
            fresh = logits.clone()
            start = time.perf_counter()
            fn(fresh)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def run(argv: list[str] | None = None) -> dict[str, float]:
    """Parse `argv`, time the contenders, print the figures; return them."""
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

    def vllm_algo(fresh: torch.Tensor) -> torch.Tensor:
        metadata = build_metadata(fresh)
        return vllm_random_sample(vllm_algorithm_probs(fresh, metadata, sampler), metadata.generators)

    median = time_alternating({
        "build": build_metadata,
        "vectorized": vectorized,
        "vllm_algo": vllm_algo,
        "loop": lambda fresh: loop_sample(fresh, params, prompts, outputs, generators),
        "sort": lambda fresh: fresh.sort(dim=-1),
    }, logits, args.repeats)
    t_vec, t_vllm, t_loop, t_sort = (median[name] for name in ("vectorized", "vllm_algo", "loop", "sort"))

    print(f"batch {args.rows} x {args.vocab}, torch threads {torch.get_num_threads()}, "
          f"{'flat' if args.flat else 'LLM-like'} logits, {args.repeats} alternating rounds (medians)")
    print(f"vectorized sampler (incl. metadata build {median['build'] * 1e3:.1f} ms): {t_vec * 1e3:9.1f} ms")
    print(f"vLLM's algorithm (sort-based top-k/top-p, race): {t_vllm * 1e3:8.1f} ms")
    print(f"per-row python loop:                            {t_loop * 1e3:9.1f} ms")
    print(f"one torch.sort of the logits:                   {t_sort * 1e3:9.1f} ms")
    speedup, cost, vs_vllm = t_loop / t_vec, t_vec / t_sort, t_vllm / t_vec
    print(f"speedup_vs_loop={speedup:.2f} cost_vs_sort={cost:.2f} speedup_vs_vllm_algo={vs_vllm:.2f}")
    return {"vectorized_s": t_vec, "vllm_algo_s": t_vllm, "loop_s": t_loop, "sort_s": t_sort,
            "speedup_vs_loop": speedup, "cost_vs_sort": cost, "speedup_vs_vllm_algo": vs_vllm}


def main(argv: list[str] | None = None) -> int:
    """`python -m mini bench sampler [options]`: exit status 0."""
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
