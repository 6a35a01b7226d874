"""The sampling-pipeline plots: each stage is exactly the sampler's op, and the real Sampler's draws follow
the last stage's distribution."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from labs import plug
from labs.views.sampling_plots import (
    STAGE_NAMES,
    chi_square,
    plot_frequencies,
    plot_sampling_pipeline,
    sampled_frequencies,
    sampling_pipeline_stages,
)
from mini import SamplingParams

PROBS = [0.05, 0.40, 0.10, 0.30, 0.15]


def _logits(vocab_size: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randn(vocab_size, generator=torch.Generator().manual_seed(seed)) * 2


def test_stage_names_and_raw_distribution():
    stages = sampling_pipeline_stages(torch.tensor(PROBS).log(), SamplingParams(temperature=1.0))
    assert [s.name for s in stages] == list(STAGE_NAMES)
    assert stages[0].probs == pytest.approx(PROBS, abs=1e-6)
    for stage in stages:  # nothing is active: every stage is the raw distribution
        assert stage.probs == pytest.approx(PROBS, abs=1e-6)
        assert stage.num_kept == 5


def test_worked_example_top_k_and_top_p():
    logits = torch.tensor(PROBS).log()
    top_k = sampling_pipeline_stages(logits, SamplingParams(temperature=1.0, top_k=2))[-1]
    assert top_k.kept == [1, 3]
    assert top_k.probs[1] == pytest.approx(0.4 / 0.7, abs=1e-6)
    top_p = sampling_pipeline_stages(logits, SamplingParams(temperature=1.0, top_p=0.5))[-1]
    assert top_p.kept == [1, 3]  # 0.40 alone is < 0.5: the boundary token 0.30 is kept
    assert top_p.top(2) == [1, 3]


def test_each_stage_is_the_op():
    logits = _logits()
    params = SamplingParams(
        temperature=0.5,
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={7: 3.0},
    )
    stages = sampling_pipeline_stages(logits, params, prompt_token_ids=[1, 2], output_token_ids=[2, 9, 9])
    bias, penalties, temperature = stages[1], stages[2], stages[3]
    expected = logits.clone()
    expected[7] += 3.0
    assert bias.logits == pytest.approx(expected.tolist(), abs=1e-6)
    for token in (1, 2, 9):
        value = expected[token].item()
        expected[token] = value / 2.0 if value > 0 else value * 2.0
    expected[2] -= 0.25 + 0.5
    expected[9] -= 0.25 * 2 + 0.5
    assert penalties.logits == pytest.approx(expected.tolist(), abs=1e-5)
    assert temperature.logits == pytest.approx((expected / 0.5).tolist(), abs=1e-5)


def test_min_p_top_k_top_p_only_shrink_the_set():
    params = SamplingParams(temperature=0.9, min_p=0.02, top_k=12, top_p=0.8)
    stages = sampling_pipeline_stages(_logits(200, seed=3), params)
    kept = [set(s.kept) for s in stages]
    assert kept[4] <= kept[3] and kept[5] <= kept[4] and len(kept[5]) <= 12
    assert math.isclose(sum(stages[-1].probs), 1.0, abs_tol=1e-5)
    best = stages[3].top(1)[0]
    assert best in kept[5]  # argmax-invariant steps keep the most likely token


def test_min_tokens_masks_the_stop_tokens():
    params = SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[4, 6], max_tokens=8)
    stage = sampling_pipeline_stages(_logits(), params, output_token_ids=[1])[1]
    assert 4 not in stage.kept and 6 not in stage.kept and stage.num_kept == 38


def test_greedy_row_stops_at_the_argmax():
    logits = _logits()
    stages = sampling_pipeline_stages(logits, SamplingParams(temperature=0.0))
    assert stages[-1].name == "greedy argmax" and stages[-1].kept == [int(logits.argmax())]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=6),
        SamplingParams(temperature=1.3, top_p=0.7, min_p=0.01),
        SamplingParams(temperature=1.0, top_k=8, top_p=0.9, repetition_penalty=1.5, frequency_penalty=0.3),
    ],
)
def test_sampler_draws_follow_the_last_stage(params):
    logits, history = _logits(30, seed=5), [3, 3, 11]
    stages = sampling_pipeline_stages(logits, params, prompt_token_ids=[1], output_token_ids=history)
    sampled = sampled_frequencies(
        logits, params, num_draws=3000, prompt_token_ids=[1], output_token_ids=history
    )
    statistic, dof = chi_square(stages[-1], sampled)
    assert sum(sampled.counts) == 3000
    assert statistic < dof + 6 * math.sqrt(2 * max(dof, 1)) + 10, (statistic, dof)  # ~6 sigma, fixed seed


def test_a_plugged_op_is_what_the_stages_show():
    def keep_everything(logits, k, p):
        return logits

    params = SamplingParams(temperature=1.0, top_k=2)
    with plug(apply_top_k_top_p=keep_everything):
        stage = sampling_pipeline_stages(torch.tensor(PROBS).log(), params)[-1]
    assert stage.num_kept == 5


def test_plots_draw():
    params = SamplingParams(temperature=0.8, top_k=5)
    stages = sampling_pipeline_stages(_logits(), params)
    axes = plot_sampling_pipeline(stages, top=8, token_label=lambda t: f"t{t}")
    assert len(axes) == len(stages)
    ax = plot_frequencies(stages[-1], sampled_frequencies(_logits(), params, num_draws=200), top=8)
    assert ax.get_title().startswith("after top-k")
