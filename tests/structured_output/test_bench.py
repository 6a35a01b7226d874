"""Smoke test of `python -m mini bench structured` (tiny sizes; figures are printed, never asserted as limits)."""

from __future__ import annotations

import math
import re

import pytest

from mini.config import SHIPPED_MODEL_DIR

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")


def test_bench_structured_prints_the_summary_line(capsys):
    from mini.__main__ import BENCHMARKS
    from mini.bench import structured

    assert BENCHMARKS["structured"] == "mini.bench.structured"
    import torch

    threads = torch.get_num_threads()
    try:
        summary = structured.main(["--num-requests", "2", "--max-tokens", "24", "--rounds", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)  # the bench sets a process-wide count: give it back
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"throughput_ratio=\d+\.\d\d mask_ms=\d+\.\d\d xgrammar_mask_ms=(\d+\.\d\d|nan) "
                        r"compile_s=\d+\.\d\d xgrammar_compile_s=(\d+\.\d\d|nan)", last), last
    assert summary["throughput_ratio"] > 0 and summary["mask_ms"] > 0 and summary["compile_s"] > 0
    assert set(summary) == {"throughput_ratio", "mask_ms", "xgrammar_mask_ms", "compile_s", "xgrammar_compile_s"}
    assert math.isnan(summary["xgrammar_mask_ms"]) or summary["xgrammar_mask_ms"] > 0
