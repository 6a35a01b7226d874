"""Smoke test of the sampler benchmark (figures are reported, never asserted)."""

from __future__ import annotations

import re

import torch

from mini.bench import sampler as bench
from mini.sample import Sampler, SamplingMetadata
from mini.sampling_params import SamplingParams

SUMMARY = r"speedup_vs_loop=\d+\.\d\d cost_vs_sort=\d+\.\d\d speedup_vs_vllm_algo=\d+\.\d\d"


def test_bench_prints_the_summary_line_last(capsys):
    result = bench.run(["--rows", "16", "--vocab", "3000", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(SUMMARY, lines[-1])
    assert result["speedup_vs_loop"] > 0 and result["cost_vs_sort"] > 0 and result["speedup_vs_vllm_algo"] > 0
    assert bench.main(["--rows", "4", "--vocab", "500", "--repeats", "1", "--flat", "--threads", "1"]) == 0
    last_line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(SUMMARY, last_line)


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


def test_vllm_algorithm_peer_and_mini_draw_from_the_same_distribution():
    """The peer's probabilities equal the distribution mini's sampler draws from, row by row."""
    logits, params, prompts, outputs = bench.make_batch(48, 3000, flat=False, seed=2)
    metadata = SamplingMetadata.build(params, prompts, outputs, {}, 3000)
    sampler = Sampler()
    expected = sampler.compute_probs(logits.clone(), metadata)
    got = bench.vllm_algorithm_probs(logits.clone(), metadata, sampler)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(got > 0, expected > 0)  # the same kept set in every row (top-k ties included)


def test_vllm_top_k_top_p_keeps_the_same_tokens_on_ties_and_edges():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [5.0, 1.0, 1.0, 1.0, 1.0]])
    k, p = torch.tensor([2, 5, 1]), torch.tensor([1.0, 0.5, 0.3])
    kept = torch.isfinite(bench.vllm_top_k_top_p(logits.clone(), k, p))
    assert kept.tolist() == [[False, True, True, False, False], [False, False, True, True, True],
                             [True, False, False, False, False]]


def test_vllm_algorithm_peer_and_mini_sample_the_same_frequencies():
    """20,000 draws each on a 3-row batch: per-token frequencies agree within sampling noise."""
    torch.manual_seed(0)
    logits = torch.randn(3, 12) * 1.5
    params = [SamplingParams(temperature=0.8, top_k=5), SamplingParams(temperature=1.0, top_p=0.7),
              SamplingParams(temperature=1.3, top_k=8, top_p=0.9)]
    empty = [[] for _ in params]
    sampler = Sampler()
    draws = 20_000
    counts = {"mini": torch.zeros(3, 12), "vllm": torch.zeros(3, 12)}
    for _ in range(draws // 1000):
        metadata = SamplingMetadata.build(params * 1000, empty * 1000, empty * 1000, {}, 12)
        batch = logits.repeat(1000, 1)
        mini_tokens = sampler(batch.clone(), metadata).sampled_token_ids.view(1000, 3)
        peer_tokens = bench.vllm_random_sample(bench.vllm_algorithm_probs(batch.clone(), metadata, sampler),
                                               {}).view(1000, 3)
        for name, tokens in (("mini", mini_tokens), ("vllm", peer_tokens)):
            for row in range(3):
                counts[name][row] += torch.bincount(tokens[:, row], minlength=12)
    mini_freq, vllm_freq = counts["mini"] / draws, counts["vllm"] / draws
    assert torch.equal(mini_freq > 0, vllm_freq > 0)  # the same support
    # Two binomial estimates of the same p differ by more than 5 standard errors with probability ~1e-6.
    std_err = ((mini_freq * (1 - mini_freq) + vllm_freq * (1 - vllm_freq)) / draws).sqrt()
    assert ((mini_freq - vllm_freq).abs() <= 5 * std_err + 1e-4).all()
