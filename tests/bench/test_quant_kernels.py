"""`python -m mini bench quant_kernels`: every kernel it times runs and gives the layer's output shape."""

from __future__ import annotations

import torch

from mini.bench import quant_kernels


def test_each_timed_kernel_runs_on_a_small_layer():
    fns = quant_kernels.kernels(64, 96)
    assert set(fns) == {"bf16", "int8_wo", "int4_wo", "q8_0_planes", "w8a8"}
    x = torch.randn(8, 96).bfloat16()
    for name, fn in fns.items():
        assert fn(x).shape == (8, 64), name


def test_median_ms_times_the_call():
    calls = []
    assert quant_kernels.median_ms(lambda: calls.append(1), repeats=3) >= 0.0
    assert len(calls) == 4   # one warm-up, then the repeats
