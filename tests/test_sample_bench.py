"""Smoke test of the sampler benchmark (figures are reported, never asserted)."""

from __future__ import annotations

import re

import torch

from mini.bench import sampler as bench
from mini.sample import Sampler, SamplingMetadata


def test_bench_prints_the_summary_line_last(capsys):
    result = bench.run(["--rows", "16", "--vocab", "3000", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"speedup_vs_loop=\d+\.\d\d cost_vs_sort=\d+\.\d\d", lines[-1])
    assert result["speedup_vs_loop"] > 0 and result["cost_vs_sort"] > 0
    assert bench.main(["--rows", "4", "--vocab", "500", "--repeats", "1", "--flat", "--threads", "1"]) == 0
    last_line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"speedup_vs_loop=\d+\.\d\d cost_vs_sort=\d+\.\d\d", last_line)


def test_loop_baseline_and_vectorized_sampler_agree_on_seeded_rows():
    logits, params, prompts, outputs = bench.make_batch(32, 3000, flat=False, seed=1)
    params = [p.clone() for p in params]
    for row, p in enumerate(params):
        p.seed = 1000 + row
    tokens = []
    for use_loop in (True, False):
        generators = {row: torch.Generator().manual_seed(p.seed) for row, p in enumerate(params)}
        if use_loop:
            tokens.append(bench.loop_sample(logits.clone(), params, prompts, outputs, generators))
        else:
            metadata = SamplingMetadata.build(params, prompts, outputs, generators, 3000)
            tokens.append(Sampler()(logits.clone(), metadata).sampled_token_ids)
    assert torch.equal(tokens[0], tokens[1])
