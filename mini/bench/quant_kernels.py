"""`python -m mini bench quant_kernels`: one linear layer's time in each CPU kernel of mini/model/quantization/.

Mirrors the kernel benchmarks of vLLM's benchmarks/kernels/ folder (one op, several shapes, no engine). For each of
SmolLM2-135M's matrix shapes and each batch (rows of x), the median of `--repeats` calls of:
    bf16        F.linear on bfloat16 weights
    int8_wo     _weight_int8pack_mm (int8_per_channel_weight_only)
    int4_wo     _weight_int4pack_mm_for_cpu, groups of 32 (gptq, gguf Q4_0/Q4_1)
    q8_0_planes two int4 planes of a Q8_0 tensor (gguf Q8_0)
    w8a8        the per-token rounding of x, torch._int_mm and the scales (int8_per_token)
Random weights: the time does not depend on the values. Prints `shape batch: kernel=ms ...` lines, then
`w8a8_vs_bf16_batch8=X` for the LM head (below 1: W8A8 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

SHAPES = {"lm_head": (49152, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)}


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernels(n: int, k: int) -> dict:
    from mini.model.quantization.gguf import pack_plane
    from mini.model.quantization.gguf_blocks import BLOCK_SIZE
    from mini.model.quantization.int8_per_token import int8_scaled_mm
    from mini.model.quantization.quant_utils import quantize_int8_per_channel

    weight = torch.randn(n, k)
    w_bf16 = weight.bfloat16()
    w_q, w_s = quantize_int8_per_channel(weight)
    w_s_bf16 = w_s.bfloat16()
    q4 = torch.randint(0, 16, (n, k), dtype=torch.int32)
    d = torch.rand(n, k // BLOCK_SIZE) * 0.01
    plane = pack_plane(q4, d, -8 * d)
    planes = [pack_plane(q4, 16 * d, -128 * d), pack_plane(q4, d, torch.zeros_like(d))]

    def int4(x, p):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, p[0], BLOCK_SIZE, p[1])

    return {"bf16": lambda x: torch.nn.functional.linear(x, w_bf16),
            "int8_wo": lambda x: torch.ops.aten._weight_int8pack_mm(x, w_q, w_s_bf16),
            "int4_wo": lambda x: int4(x, plane),
            "q8_0_planes": lambda x: int4(x, planes[0]) + int4(x, planes[1]),
            "w8a8": lambda x: int8_scaled_mm(x, w_q.t(), w_s, None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini bench quant_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    from mini.bench.workload import machine_line

    torch.set_num_threads(args.threads)
    print(machine_line(torch.get_num_threads(), "cpu"))
    ratio = None
    with torch.inference_mode():
        for name, (n, k) in SHAPES.items():
            fns = kernels(n, k)
            for batch in args.batches:
                x = torch.randn(batch, k).bfloat16()
                times = {kernel: median_ms(lambda fn=fn, x=x: fn(x), args.repeats) for kernel, fn in fns.items()}
                print(f"{name} [{n}, {k}] batch {batch}: " + " ".join(f"{key}={ms:.3f}ms" for key, ms in times.items()))
                if name == "lm_head" and batch == 8:
                    ratio = times["w8a8"] / times["bf16"]
    if ratio is not None:
        print(f"w8a8_vs_bf16_batch8={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
