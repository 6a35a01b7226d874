"""Attention benchmark: the Triton paged decode kernel against the PyTorch reference and SDPA.

Mirrors the role of vLLM's benchmarks/kernels/benchmark_paged_attention.py. Decode is memory bound:
each step reads every cached key and value of every request once, so the figure of merit is the
effective bandwidth (bytes of K/V read per second). Three timings per context length, same inputs:

* `triton`: `mini.attention.triton_paged.paged_attention` (the decode kernel walks the block table);
* `torch`: `mini.attention.reference.paged_attention` (gathers the blocks into new tensors, then einsum);
* `sdpa`: `torch.nn.functional.scaled_dot_product_attention` on K/V that were gathered into contiguous
  tensors beforehand (not timed): what a contiguous, non-paged cache would cost.

Default shape (GPU): 64 requests, 32 query heads over 8 KV heads, head size 128, block size 16, bf16,
contexts 512..4096. Without a GPU it runs a tiny shape under TRITON_INTERPRET=1 only to show that it
works; those timings mean nothing. Last line: `speedup_vs_torch=X.XX cost_vs_sdpa=Y.YY` at the longest context.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

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


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m mini bench attention", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--contexts", default="512,1024,2048,4096", help="comma-separated context lengths")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    contexts = [int(value) for value in args.contexts.split(",")]
    if min(args.requests, args.num_kv_heads, args.head_size, args.block_size, args.repeats, *contexts) < 1:
        raise ValueError("--requests, --num-kv-heads, --head-size, --block-size, --repeats, --contexts must be >= 1")
    if args.num_heads % args.num_kv_heads:
        raise ValueError(f"--num-heads ({args.num_heads}) must be a multiple of --num-kv-heads ({args.num_kv_heads})")
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
