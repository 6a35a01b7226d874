"""Attention benchmark: mini's paged attention against the same K/V stored contiguously (the no-paging limit).

Mirrors the role of vLLM's benchmarks/kernels/benchmark_paged_attention.py. Two suites, same question
(what does reading K/V through a block table cost over reading it from one contiguous tensor?):

CPU (default without a GPU; `--kernel cpu`): batches shaped like engine steps (see `MIXES`: decode with
uniform and with ragged contexts, speculative verification rows of 1 + 4 tokens, fresh prompts, a
prefill chunk over a long context, a prompt mixed with decodes). One timed call is one step through
`--layers` layers, each with its own cache (so K/V is not left in the core's cache by the previous
layer), and the figures are per layer:

* `paged`: `mini.attention.cpu_paged.paged_attention`, the CPU default ("torch_fast"); it builds its plan
  on the first layer of the step and reuses it (the `plan` column: that build alone, once per step);
* `contiguous`: `scaled_dot_product_attention` on the same K/V already laid out per request as
  `[Hkv, L, D]` (nothing to gather: the no-paging limit), run both as one call padded to the longest
  context with a mask (transformers' padded cache) and as one call per request; the faster is the peer;
* `reference`: `mini.attention.reference.paged_attention`, the readable phase 03 version.

Contenders alternate inside every round; medians of `--rounds` rounds. Default shape: SmolLM2-135M's
(9 query heads over 3 KV heads, head size 64), block size 16, float32. On a machine shared with other
jobs prefer `--threads 1`: with more threads every parallel op waits for its slowest thread, and a
descheduled thread costs a whole time slice. Last line:
`paged_over_contiguous=X.XX speedup_vs_reference=Y.YY`, geometric means over the mixes.

GPU (`--kernel triton`, the default with CUDA): the Triton paged decode kernel against the reference and
SDPA on pre-gathered K/V, 64 requests, 32 heads over 8 KV heads, head size 128, bf16, contexts 512..4096.
Without a GPU `--kernel triton` runs a tiny shape under TRITON_INTERPRET=1 only to show that it works;
those timings mean nothing. Last line: `speedup_vs_torch=X.XX cost_vs_sdpa=Y.YY` at the longest context.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mini.attention import reference
from mini.utils import cdiv

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_decode_batch(num_requests: int, context_len: int, num_heads: int, num_kv_heads: int, head_size: int,
                      block_size: int, dtype: torch.dtype, device: str, seed: int = 0):
    """A paged cache with every request at `context_len` tokens, blocks scattered at random."""
    generator = torch.Generator(device=device).manual_seed(seed)
    blocks_per_request = cdiv(context_len, block_size)
    num_blocks = num_requests * blocks_per_request + 1  # + the null block 0
    block_ids = list(range(1, num_blocks))
    random.Random(seed).shuffle(block_ids)
    block_table = torch.tensor(block_ids, dtype=torch.int32, device=device).view(num_requests, blocks_per_request)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=generator,
                           device=device).to(dtype)
    query = torch.randn(num_requests, num_heads, head_size, generator=generator, device=device).to(dtype)
    metadata = reference.AttentionMetadata(
        num_actual_tokens=num_requests,
        query_start_loc=torch.arange(num_requests + 1, dtype=torch.int32, device=device),
        seq_lens=torch.full((num_requests,), context_len, dtype=torch.int32, device=device),
        block_table=block_table,
        slot_mapping=torch.full((num_requests,), -1, dtype=torch.int64, device=device),
        max_query_len=1,
        max_seq_len=context_len,
    )
    return query, kv_cache, metadata


def gather_contiguous(kv_cache: torch.Tensor, metadata, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as [B, Hkv, L, D], the layout SDPA wants."""
    blocks = metadata.block_table.long()
    keys = kv_cache[0][blocks].flatten(1, 2)[:, :context_len].transpose(1, 2).contiguous()
    values = kv_cache[1][blocks].flatten(1, 2)[:, :context_len].transpose(1, 2).contiguous()
    return keys, values


def time_it(fn: Callable[[], object], repeats: int, device: str) -> float:
    """Median seconds per call (CUDA: synchronized around each call)."""
    fn()  # warm-up (and Triton compilation)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Engine-step shapes: each mix is a list of (new query tokens, context length incl. them) per request.
def _ragged(count: int, low: int, high: int, query_len: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(query_len, rng.randint(max(low, query_len), high)) for _ in range(count)]


MIXES: dict[str, list[tuple[int, int]]] = {
    "decode-uniform": [(1, 512)] * 32,
    "decode-ragged": _ragged(64, 16, 1024, 1, seed=1),
    "verify-1+4": _ragged(32, 256, 1024, 5, seed=2),
    "prefill": [(256, 256)] * 4,
    "prefill-chunk": [(256, 1024)] * 2,
    "prefill+decode": [(512, 512)] + _ragged(31, 16, 1024, 1, seed=3),
}


def make_batch(mix: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
               dtype: torch.dtype, num_layers: int = 1, seed: int = 0):
    """A step's batch: one query and metadata, and per layer a paged cache holding every request's context
    (blocks shuffled) and the same K/V laid out contiguously per request as `[2, Hkv, L, D]`."""
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [seq_len for _, seq_len in mix]
    query_lens = [query_len for query_len, _ in mix]
    block_counts = [cdiv(seq_len, block_size) for seq_len in seq_lens]
    block_ids = list(range(1, sum(block_counts) + 1))
    random.Random(seed).shuffle(block_ids)
    block_table = torch.zeros(len(mix), max(block_counts), dtype=torch.int32)
    slots = []
    for row, (seq_len, count) in enumerate(zip(seq_lens, block_counts, strict=False)):
        block_table[row, :count] = torch.tensor(block_ids[:count])
        block_ids = block_ids[count:]
        positions = torch.arange(seq_len)
        slots.append(block_table[row, positions // block_size].long() * block_size + positions % block_size)
    kv_caches, contiguous = [], []
    for _ in range(num_layers):
        kv_cache = torch.zeros(2, sum(block_counts) + 1, block_size, num_kv_heads, head_size, dtype=dtype)
        per_request = []
        for seq_len, request_slots in zip(seq_lens, slots, strict=False):
            keys_values = torch.randn(2, seq_len, num_kv_heads, head_size, generator=generator).to(dtype)
            kv_cache[:, request_slots // block_size, request_slots % block_size] = keys_values
            per_request.append(keys_values.transpose(1, 2).contiguous())
        kv_caches.append(kv_cache)
        contiguous.append(per_request)
    query_start_loc = torch.tensor([0] + [sum(query_lens[: i + 1]) for i in range(len(mix))], dtype=torch.int32)
    num_tokens = sum(query_lens)
    metadata = reference.AttentionMetadata(
        num_actual_tokens=num_tokens, query_start_loc=query_start_loc,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table=block_table,
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
    )
    query = torch.randn(num_tokens, num_heads, head_size, generator=generator).to(dtype)
    return query, kv_caches, metadata, contiguous


def sdpa_one_request(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """query `[b, q, Hq, D]` (the last q positions), keys/values `[b, Hkv, L, D]` -> `[b, q, Hq, D]`.

    Few query rows: each KV head's `group_size` query heads become rows of that head (no K/V copies);
    many rows: SDPA's own `enable_gqa`. `mask`: bool `[b, q, L]`, None for a fresh causal prompt.
    """
    batch, query_len, num_heads, head_size = query.shape
    num_kv_heads = keys.shape[1]
    group_size = num_heads // num_kv_heads
    if query_len > 16:
        out = F.scaled_dot_product_attention(query.transpose(1, 2), keys, values, scale=scale, enable_gqa=True,
                                             attn_mask=None if mask is None else mask[:, None],
                                             is_causal=mask is None)
        return out.transpose(1, 2)
    grouped = query.view(batch, query_len, num_kv_heads, group_size, head_size).permute(0, 2, 3, 1, 4)
    grouped = grouped.reshape(batch, num_kv_heads, group_size * query_len, head_size)
    if mask is not None:
        mask = mask[:, None].expand(batch, group_size, query_len, -1).reshape(batch, 1, group_size * query_len, -1)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
    return out.view(batch, num_kv_heads, group_size, query_len, head_size).permute(0, 3, 1, 2, 4).reshape(
        batch, query_len, num_heads, head_size)


def contiguous_contenders(query: torch.Tensor, metadata, contiguous: list[list[torch.Tensor]], scale: float
                          ) -> dict[str, Callable[[], list[torch.Tensor]]]:
    """SDPA on every layer's contiguous per-request K/V: padded into one call, and one call per request."""
    starts = metadata.query_start_loc.tolist()
    query_lens = [end - start for start, end in itertools.pairwise(starts)]
    seq_lens = metadata.seq_lens.tolist()
    masks = [None if q == s else torch.ones(q, s, dtype=torch.bool).tril(s - q)
             for q, s in zip(query_lens, seq_lens, strict=False)]
    # Padded: transformers' layout [B, Hkv, Lmax, D]; query rows padded to the longest; a mask per request.
    longest, widest = max(seq_lens), max(query_lens)
    padded_kv = []
    for layer in contiguous:
        padded = torch.zeros(2, len(seq_lens), layer[0].shape[1], longest, layer[0].shape[3], dtype=query.dtype)
        for row, kv in enumerate(layer):
            padded[:, row, :, : kv.shape[2]] = kv
        padded_kv.append(padded)
    padded_mask = torch.zeros(len(seq_lens), widest, longest, dtype=torch.bool)
    padded_rows = []
    for row, (q, s) in enumerate(zip(query_lens, seq_lens, strict=False)):
        padded_mask[row, :q, :s] = torch.ones(q, s, dtype=torch.bool).tril(s - q)
        padded_mask[row, q:, 0] = True  # padding query rows see one key (no NaN), and are dropped
        padded_rows += [starts[row] + i for i in range(q)] + [starts[row]] * (widest - q)
    padded_rows_t = torch.tensor(padded_rows)
    real = torch.tensor([row * widest + i for row, q in enumerate(query_lens) for i in range(q)])

    def padded() -> list[torch.Tensor]:
        rows = query.index_select(0, padded_rows_t).view(len(seq_lens), widest, *query.shape[1:])
        return [sdpa_one_request(rows, kv[0], kv[1], padded_mask, scale).flatten(0, 1).index_select(0, real)
                for kv in padded_kv]

    def per_request() -> list[torch.Tensor]:
        outputs = []
        for layer in contiguous:
            output = torch.empty_like(query)
            for start, end, kv, mask in zip(starts[:-1], starts[1:], layer, masks, strict=False):
                output[start:end] = sdpa_one_request(query[None, start:end], kv[0][None], kv[1][None],
                                                     None if mask is None else mask[None], scale)[0]
            outputs.append(output)
        return outputs

    return {"padded": padded, "per_request": per_request}


def measure_mix(mix: list[tuple[int, int]], args: argparse.Namespace, dtype: torch.dtype
                ) -> tuple[dict[str, float], float, int]:
    """Median seconds per layer of each contender, the largest deviation from the reference, the tokens.

    Every timed call is one engine step: all `--layers` layers, each with its own cache, so a layer's K/V
    is not still in the core's cache from the previous call, and the paged path builds its plan once per
    step, on the first layer, as in the engine (a fresh metadata object per step).
    """
    from mini.attention import cpu_paged

    scale = args.head_size**-0.5
    query, kv_caches, metadata, contiguous = make_batch(
        mix, args.num_heads, args.num_kv_heads, args.head_size, args.block_size, dtype, args.layers)

    def paged() -> list[torch.Tensor]:
        step_metadata = dataclasses.replace(metadata)
        return [cpu_paged.paged_attention(query, kv_cache, step_metadata, scale) for kv_cache in kv_caches]

    def plan() -> cpu_paged.StepPlan:
        return cpu_paged.get_plan(dataclasses.replace(metadata), kv_caches[0], query)

    def torch_reference() -> list[torch.Tensor]:
        return [reference.paged_attention(query, kv_cache, metadata, scale) for kv_cache in kv_caches]

    contenders = {"paged": paged, "plan": plan, **contiguous_contenders(query, metadata, contiguous, scale),
                  "reference": torch_reference}
    expected = torch.stack(torch_reference()).float()
    max_error = max((torch.stack(contenders[key]()).float() - expected).abs().max().item()
                    for key in ("paged", "padded", "per_request"))
    times: dict[str, list[float]] = {key: [] for key in contenders}
    for _ in range(args.rounds):
        for key, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    per_layer = {key: statistics.median(values) / args.layers for key, values in times.items()}
    per_layer["plan"] *= args.layers  # built once per step
    return per_layer, max_error, query.shape[0]


def run_cpu(args: argparse.Namespace) -> dict[str, float]:
    """The CPU suite: mini's paged path vs contiguous SDPA vs the reference, per mix."""
    print(f"CPU paged attention: {args.num_heads} heads / {args.num_kv_heads} KV heads, head size {args.head_size}, "
          f"block size {args.block_size}, {args.dtype}, torch threads {torch.get_num_threads()}; steps of "
          f"{args.layers} layers, {args.rounds} alternating rounds (medians, microseconds per layer; "
          "plan: once per step, included in paged)")
    print(f"{'mix':>15} {'tokens':>7} {'paged':>8} {'plan':>7} {'contig':>8} {'reference':>9} "
          f"{'paged/contig':>12} {'max err':>8}")
    results: dict[str, float] = {}
    for name in args.mixes:
        median, max_error, num_tokens = measure_mix(MIXES[name], args, DTYPES[args.dtype])
        contiguous_time = min(median["padded"], median["per_request"])
        ratio = median["paged"] / contiguous_time
        print(f"{name:>15} {num_tokens:>7} {median['paged'] * 1e6:>8.0f} {median['plan'] * 1e6:>7.0f} "
              f"{contiguous_time * 1e6:>8.0f} {median['reference'] * 1e6:>9.0f} {ratio:>12.2f} {max_error:>8.1e}")
        results.update({f"paged_s@{name}": median["paged"], f"plan_s@{name}": median["plan"],
                        f"contiguous_s@{name}": contiguous_time, f"reference_s@{name}": median["reference"],
                        f"max_error@{name}": max_error})
    ratios = [results[f"paged_s@{name}"] / results[f"contiguous_s@{name}"] for name in args.mixes]
    speedups = [results[f"reference_s@{name}"] / results[f"paged_s@{name}"] for name in args.mixes]
    results["paged_over_contiguous"] = statistics.geometric_mean(ratios)
    results["speedup_vs_reference"] = statistics.geometric_mean(speedups)
    print(f"paged_over_contiguous={results['paged_over_contiguous']:.2f} "
          f"speedup_vs_reference={results['speedup_vs_reference']:.2f}")
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench attention", description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=("cpu", "triton"), default=None,
                        help="cpu: mini's CPU path (default without CUDA); "
                             "triton: the Triton kernels (default with CUDA)")
    parser.add_argument("--num-heads", type=int, default=None, help="default 9 (cpu), 32 (triton)")
    parser.add_argument("--num-kv-heads", type=int, default=None, help="default 3 (cpu), 8 (triton)")
    parser.add_argument("--head-size", type=int, default=None, help="default 64 (cpu), 128 (triton)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default float32 (cpu), bfloat16 (triton)")
    parser.add_argument("--mixes", default=",".join(MIXES), help=f"cpu: comma-separated, from {', '.join(MIXES)}")
    parser.add_argument("--rounds", type=int, default=15, help="cpu: alternating rounds")
    parser.add_argument("--layers", type=int, default=6, help="cpu: layers per step, each with its own cache")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--requests", type=int, default=64, help="triton: decode requests")
    parser.add_argument("--contexts", default="512,1024,2048,4096", help="triton: comma-separated context lengths")
    parser.add_argument("--repeats", type=int, default=20, help="triton: timed calls per context")
    return parser


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = build_parser().parse_args(argv)
    kernel = args.kernel or ("triton" if torch.cuda.is_available() else "cpu")
    defaults = {"num_heads": 9, "num_kv_heads": 3, "head_size": 64, "dtype": "float32"} if kernel == "cpu" else \
        {"num_heads": 32, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.mixes = [name for name in args.mixes.split(",") if name]
    unknown = sorted(set(args.mixes) - set(MIXES))
    if unknown or not args.mixes:
        raise ValueError(f"--mixes must name some of {sorted(MIXES)}, got {unknown or 'none'}")
    if min(args.num_heads, args.num_kv_heads, args.head_size, args.block_size, args.rounds, args.layers,
           args.requests, args.repeats) < 1:
        raise ValueError("--num-heads, --num-kv-heads, --head-size, --block-size, --rounds, --layers, --requests, "
                         "--repeats must be >= 1")
    if args.num_heads % args.num_kv_heads:
        raise ValueError(f"--num-heads ({args.num_heads}) must be a multiple of --num-kv-heads ({args.num_kv_heads})")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if kernel == "cpu":
        with torch.inference_mode():
            return run_cpu(args)
    return run_triton(args)


def run_triton(args: argparse.Namespace) -> dict[str, float]:
    """The Triton suite (decode): kernel vs reference vs SDPA on pre-gathered K/V, per context length."""
    contexts = [int(value) for value in args.contexts.split(",")]
    if min(contexts) < 1:
        raise ValueError("--contexts must be >= 1")
    on_gpu = torch.cuda.is_available()
    if not on_gpu:  # a tiny shape, just to prove the code path under the interpreter
        args.requests, args.num_heads, args.num_kv_heads, args.head_size = 2, 4, 2, 32
        contexts, args.repeats, args.dtype = [16, 48], 2, "float32"
        print("no CUDA GPU: running a tiny shape under TRITON_INTERPRET=1 to show the benchmark works; "
              "the timings below mean nothing (run on a GPU for real numbers)")

    from mini.attention import triton_paged  # imported here: needs Linux x86_64 (clear ImportError otherwise)

    device, dtype = ("cuda" if on_gpu else "cpu"), DTYPES[args.dtype]
    scale = args.head_size**-0.5
    print(f"decode: {args.requests} requests, {args.num_heads} heads / {args.num_kv_heads} KV heads, "
          f"head size {args.head_size}, block size {args.block_size}, {args.dtype}, device {device}")
    print(f"{'context':>8} {'triton us':>10} {'torch us':>10} {'sdpa us':>10} {'triton GB/s':>12} {'max err':>9}")
    results: dict[str, float] = {}
    for context_len in contexts:
        query, kv_cache, metadata = make_decode_batch(
            args.requests, context_len, args.num_heads, args.num_kv_heads, args.head_size, args.block_size,
            dtype, device,
        )
        keys, values = gather_contiguous(kv_cache, metadata, context_len)
        sdpa_query = query.unsqueeze(2)  # [B, Hq, 1, D]

        def run_sdpa(sdpa_query=sdpa_query, keys=keys, values=values) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                sdpa_query, keys, values, scale=scale, enable_gqa=True
            )

        def run_triton(query=query, kv_cache=kv_cache, metadata=metadata) -> torch.Tensor:
            return triton_paged.paged_attention(query, kv_cache, metadata, scale)

        def run_torch(query=query, kv_cache=kv_cache, metadata=metadata) -> torch.Tensor:
            return reference.paged_attention(query, kv_cache, metadata, scale)

        max_error = (run_triton().float() - run_sdpa().squeeze(2).float()).abs().max().item()
        t_triton = time_it(run_triton, args.repeats, device)
        t_torch = time_it(run_torch, args.repeats, device)
        t_sdpa = time_it(run_sdpa, args.repeats, device)
        kv_bytes = 2 * args.requests * context_len * args.num_kv_heads * args.head_size * kv_cache.element_size()
        print(f"{context_len:>8} {t_triton * 1e6:>10.1f} {t_torch * 1e6:>10.1f} {t_sdpa * 1e6:>10.1f} "
              f"{kv_bytes / t_triton / 1e9:>12.1f} {max_error:>9.2e}")
        results.update({f"triton_s@{context_len}": t_triton, f"torch_s@{context_len}": t_torch,
                        f"sdpa_s@{context_len}": t_sdpa, f"max_error@{context_len}": max_error})
    longest = contexts[-1]
    speedup = results[f"torch_s@{longest}"] / results[f"triton_s@{longest}"]
    cost = results[f"triton_s@{longest}"] / results[f"sdpa_s@{longest}"]
    print(f"speedup_vs_torch={speedup:.2f} cost_vs_sdpa={cost:.2f}")
    results.update({"speedup_vs_torch": speedup, "cost_vs_sdpa": cost})
    return results




if __name__ == "__main__":
    main()
