"""Smoke test of `python -m mini bench attention --kernel triton` (mini/bench/attention.py): runs, and agrees.

On CPU the Triton suite shrinks itself to a tiny shape under TRITON_INTERPRET=1; timings are never asserted.
(The CPU suite, the default without a GPU, is tested in tests/attention/test_cpu_fast.py.)
"""
from __future__ import annotations

import math

import pytest
import torch

triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-sized run is for `python -m mini bench attention`")
def test_attention_benchmark_runs_on_cpu_and_kernel_matches_sdpa(capsys):
    from mini.bench import attention

    results = attention.main(["--kernel", "triton"])
    printed = capsys.readouterr().out
    assert "TRITON_INTERPRET=1" in printed and "speedup_vs_torch=" in printed
    errors = [value for key, value in results.items() if key.startswith("max_error@")]
    assert len(errors) == 2 and max(errors) < 1e-5
    assert all(math.isfinite(results[key]) and results[key] > 0 for key in ("speedup_vs_torch", "cost_vs_sdpa"))


def test_attention_benchmark_rejects_bad_arguments():
    from mini.bench import attention

    with pytest.raises(ValueError, match="--num-heads"):
        attention.main(["--num-heads", "6", "--num-kv-heads", "4"])
